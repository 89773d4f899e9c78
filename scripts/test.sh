#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration (including the S3 conformance run
# against an S3-compatible server the tests start in-process on loopback) and doc tests.
# Needs only a Rust toolchain: everything else is built by cargo. Lints are a separate,
# slower command: scripts/lint.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo fmt --all -- --check
# One invocation builds each library once for unit, integration and doc tests (examples are
# compiled too; the workspace has no bench targets).
cargo test --workspace
