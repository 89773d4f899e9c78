#!/usr/bin/env bash
# The Python package `ftrec` (python/, its extension module the ftrec-py crate) built and
# installed into a virtual environment, target/py-venv ($FTREC_PY_VENV), made on first use and
# reused after: maturin 1.x, numpy, safetensors and pytest from PyPI, then `pip install ./python`
# (a release build of the ftrec-py crate alone; FTREC_PY_PROFILE=dev builds it with the dev profile,
# mostly unoptimized and quick to build, sharing what a `cargo test` build compiled where the
# features agree). Use it as target/py-venv/bin/python.
#
#   scripts/python.sh          build and install
#   scripts/python.sh --test   also run python/tests with pytest; the tests make stores with the
#                              `ftrec` binary: $FTREC_BIN, else target/debug/ftrec (built here
#                              with `cargo build -p ftrec-cli` when missing)
#
# Needs a Rust toolchain and python3 (3.9 or newer) that can make a venv; on Debian without
# python3-venv, root installs it with apt-get, anyone else is told to.
set -euo pipefail
cd "$(dirname "$0")/.."

run_tests=false
for a in "$@"; do
    case "$a" in
        --test) run_tests=true ;;
        -h | --help)
            sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "scripts/python.sh: unknown argument $a (give --test, or nothing)" >&2
            exit 2
            ;;
    esac
done

python=${PYTHON:-python3}
venv=${FTREC_PY_VENV:-target/py-venv}
start=$SECONDS
say() { echo "scripts/python.sh: $*" >&2; }

if ! command -v "$python" >/dev/null; then
    say "no $python on PATH: install Python 3.9 or newer (or name it with PYTHON=...)"
    exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
    say "$("$python" --version 2>&1) is too old: the package needs Python 3.9 or newer"
    exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
    # Debian's python3 makes a venv only with python3-venv (ensurepip) installed.
    if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "installing python3-venv with apt-get"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        else
            say "$python cannot make a virtual environment: install python3-venv (sudo apt-get install python3-venv)"
            exit 1
        fi
    fi
    rm -rf "$venv"
    say "making the virtual environment $venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
fi
# As if activated: the build backend runs the venv's `maturin` executable.
PATH="$(cd "$venv/bin" && pwd):$PATH"
export PATH
pip=("$venv/bin/python" -m pip)
# Already installed: no download (pip only checks what is there).
"${pip[@]}" install -q 'maturin>=1.9.4,<2' numpy safetensors pytest
tools=$SECONDS

# The build tools are in the venv already: no isolated build environment to download again.
# The crate is built into the workspace's target/ (release), so a rebuild is incremental.
profile=${FTREC_PY_PROFILE:-release}
say "building and installing ./python ($profile build of ftrec-py)"
CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0} MATURIN_PEP517_ARGS="--profile $profile" \
    "${pip[@]}" install -q --no-build-isolation --no-deps --force-reinstall ./python
say "venv ready in $((tools - start)) s, package built and installed in $((SECONDS - tools)) s"

if $run_tests; then
    if [ -z "${FTREC_BIN:-}" ]; then
        FTREC_BIN=$PWD/target/debug/ftrec
        if [ ! -x "$FTREC_BIN" ]; then
            say "building the ftrec binary for the tests (cargo build -p ftrec-cli)"
            CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0} cargo build -q -p ftrec-cli
        fi
    fi
    export FTREC_BIN
    "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
    say "done in $((SECONDS - start)) s"
fi
