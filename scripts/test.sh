#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration (including the S3 conformance run
# against an S3-compatible server the tests start in-process on loopback) and doc tests.
# Needs only a Rust toolchain: everything else is built by cargo, or installed by the
# project's scripts where the machine allows (container tools as root with apt-get; tests whose
# tools are missing skip with one line). Lints are a separate, slower command: scripts/lint.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo fmt --all -- --check
# The container-image test's tools, where this machine can install them (root with apt-get);
# elsewhere that test skips with one line.
./scripts/container-tools.sh
# One invocation builds each library once for unit, integration and doc tests (examples are
# compiled too; the workspace has no bench targets).
cargo test --workspace
