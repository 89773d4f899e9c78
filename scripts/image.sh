#!/usr/bin/env bash
# Builds the ftrec container image from scratch, without pulling a base image: the `ftrec`
# binary, exactly the shared libraries `ldd` says it loads (and the dynamic loader), the CA
# bundle the S3 client reads for https endpoints, /etc/passwd and /etc/group with the user
# `ftrec` (uid and gid 10001), a writable /work (the working directory, owned by ftrec) and
# /tmp. Entry point /usr/local/bin/ftrec, user 10001. Written as an OCI archive: `podman load`
# reads it, `skopeo copy` pushes it to a registry or turns it into a docker archive (which
# kind and k3s import; README, "Run on Kubernetes").
#
#   scripts/image.sh [--binary PATH] [--out PATH] [--tag NAME:TAG] [--strip-debug]
#
#   --binary PATH  the ftrec binary to put in (a debug build, say) [default: build
#                  target/release/ftrec with `cargo build --release -p ftrec-cli`]
#   --out PATH     the OCI archive to write [default: target/image/ftrec-oci.tar]
#   --tag NAME:TAG the image's name [default: ftrec:VERSION, VERSION from Cargo.toml]
#   --strip-debug  leave the binary's debug info out (the release profile keeps it for
#                  profiles and backtraces with line numbers): about 35 MB instead of 170
#
# Needs buildah (installed with apt-get when missing and run as root). Its containers
# storage lives in a temporary directory (vfs driver) that is removed at the end: nothing is
# left in the machine's image store. Images for a registry: the Containerfile at the root of
# the repository.
set -euo pipefail

die() {
    echo "image.sh: $*" >&2
    exit 1
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$(awk -F'"' '/^\[workspace\.package\]/ { ws = 1; next } /^\[/ { ws = 0 }
    ws && /^version *=/ { print $2; exit }' "$root/Cargo.toml")"
[[ -n "$version" ]] || die "no version in the [workspace.package] table of $root/Cargo.toml"

binary=""
strip_debug=false
out="$root/target/image/ftrec-oci.tar"
tag="ftrec:$version"
while [[ $# -gt 0 ]]; do
    case "$1" in
    --binary | --out | --tag)
        [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value"
        case "$1" in
        --binary) binary="$2" ;;
        --out) out="$2" ;;
        --tag) tag="$2" ;;
        esac
        shift 2
        ;;
    --strip-debug)
        strip_debug=true
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$tag" == *:* ]] || tag="$tag:$version"

if ! command -v buildah >/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "image.sh: installing buildah with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends buildah >&2 ||
            die "apt-get could not install buildah"
    else
        die "buildah is missing: install it (Debian/Ubuntu: apt-get install buildah; Fedora: dnf install buildah)"
    fi
fi

if [[ -z "$binary" ]]; then
    echo "image.sh: building the release binary (cargo build --release -p ftrec-cli)" >&2
    (cd "$root" && cargo build --release -p ftrec-cli --bin ftrec >&2)
    binary="$root/target/release/ftrec"
fi
[[ -f "$binary" && -x "$binary" ]] || die "$binary is not an executable file"
"$binary" --version >/dev/null 2>&1 || die "$binary --version failed: not a working ftrec binary"

work="$(mktemp -d "${TMPDIR:-/tmp}/ftrec-image.XXXXXX")"
ctr=""
cleanup() {
    if [[ -n "$ctr" ]]; then
        buildah rm "$ctr" >/dev/null 2>&1 || true
    fi
    # Files of the vfs store may be read-only for their owner: make them writable first.
    chmod -R u+w "$work" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A storage of its own: the vfs driver works wherever the script runs (no overlay mounts),
# and the machine's configuration and image store are left alone.
cat >"$work/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
export BUILDAH_ISOLATION=chroot

# The root file system, laid out in a directory first.
rootfs="$work/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs"
if $strip_debug; then
    command -v strip >/dev/null || die "--strip-debug needs strip (apt-get install binutils)"
    strip --strip-debug -o "$rootfs/usr/local/bin/ftrec" "$binary"
    chmod 0755 "$rootfs/usr/local/bin/ftrec"
else
    install -m 0755 "$binary" "$rootfs/usr/local/bin/ftrec"
fi

# Every library the binary loads, at the path the loader finds it (ldd prints `name => path
# (address)` for libraries and `path (address)` for the loader; linux-vdso has no file).
if ! libs="$(ldd "$binary" 2>&1)"; then
    # A static binary needs no library (ldd says so and fails); anything else is an error.
    grep -q 'not a dynamic executable' <<<"$libs" || die "ldd $binary failed: $libs"
    libs=""
fi
if grep -q 'not found' <<<"$libs"; then
    die "$binary needs libraries this machine lacks: $(grep 'not found' <<<"$libs" | tr -s ' \t' ' ')"
fi
while read -r path; do
    [[ -n "$path" ]] || continue
    mkdir -p "$rootfs$(dirname "$path")"
    # The file the loader opens, under the name it asks for (symlinks resolved).
    cp -L "$path" "$rootfs$path"
    echo "image.sh: + $path" >&2
done < <(awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }' <<<"$libs")

# https S3 endpoints: the client (reqwest with rustls-platform-verifier) reads the system's
# roots through rustls-native-certs on Linux, the first file of openssl-probe's list that
# exists (Debian's path below), or $SSL_CERT_FILE; no roots are compiled in.
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [[ ! -s "$ca_bundle" ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "image.sh: installing ca-certificates with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates >&2 ||
            die "apt-get could not install ca-certificates"
    fi
    [[ -s "$ca_bundle" ]] || die "$ca_bundle is missing: install ca-certificates (https S3 endpoints need it)"
fi
install -m 0644 "$ca_bundle" "$rootfs$ca_bundle"

cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
ftrec:x:10001:10001:ftrec:/work:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
ftrec:x:10001:
EOF
# glibc's lookups: host names from /etc/hosts first (the container runtime writes it), then DNS.
cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"

ctr="$(buildah from --quiet scratch)"
# The tree as laid out (modes kept: /tmp is world-writable and sticky, as everywhere), then
# /work, owned by the user ftrec.
mkdir "$rootfs/tmp" "$work/empty"
chmod 1777 "$rootfs/tmp"
buildah copy --quiet "$ctr" "$rootfs" / >/dev/null
buildah copy --quiet --chown 10001:10001 --chmod 0755 "$ctr" "$work/empty" /work >/dev/null
buildah config \
    --entrypoint '["/usr/local/bin/ftrec"]' \
    --cmd '["--help"]' \
    --user 10001:10001 \
    --workingdir /work \
    --env PATH=/usr/local/bin \
    --env SSL_CERT_FILE="$ca_bundle" \
    --port 7000/tcp --port 7100/tcp --port 9100/tcp \
    --label org.opencontainers.image.title=ftrec \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label org.opencontainers.image.description="Fault-tolerant training of deep-learning recommendation models" \
    "$ctr"

mkdir -p "$(dirname "$out")"
rm -f "$out"
buildah commit --quiet --format oci --disable-compression=false --rm "$ctr" "oci-archive:$out:$tag" >/dev/null
ctr=""
size="$(du -h "$out" | cut -f1)"
echo "image.sh: wrote $out ($tag, $size)"
