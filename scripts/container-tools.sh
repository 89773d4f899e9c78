#!/usr/bin/env bash
# Installs what the container-image test needs (buildah builds the image, podman and runc run
# it), when it is missing and this machine can install it: run as root with apt-get (a Debian
# or Ubuntu machine, such as CI's). Elsewhere it says what is missing in one line and returns
# success: the image test then skips with one line of its own. Never fails the caller.
set -uo pipefail
missing=()
for tool in buildah podman runc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "container-tools.sh: ${missing[*]} missing (not root with apt-get: the image test will skip)" >&2
    exit 0
fi
echo "container-tools.sh: installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    # A fresh machine may not have read the package lists yet.
    apt-get update >/dev/null 2>&1 &&
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        echo "container-tools.sh: apt-get could not install ${missing[*]} (the image test will skip)" >&2
fi
exit 0
