#!/usr/bin/env bash
# Formatting and clippy with warnings as errors, over every target of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
