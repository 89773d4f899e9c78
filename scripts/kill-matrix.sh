#!/usr/bin/env bash
# The whole kill matrix: every strategy x every kill phase it has x every role (server,
# worker, merger, replacement), each cell a synchronous run of real processes with that
# SIGKILL, checked against the failure-free digest (crates/cluster/tests/kill_matrix.rs); its
# pause column of the coordinator row from the frozen-job test (crates/cli/tests/frozen.rs).
# Writes the table to docs/kill-matrix.md (or $KILL_MATRIX_OUT) and exits non-zero if a cell
# failed. The test profile (as `cargo test` builds); a few minutes on two cores.
#
#   scripts/kill-matrix.sh                 # every strategy
#   scripts/kill-matrix.sh deck,ecrec      # only these rows (the table holds only them)
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/.."
out="${KILL_MATRIX_OUT:-$PWD/docs/kill-matrix.md}"
# A relative KILL_MATRIX_OUT is relative to the directory the script was started from.
case "$out" in /*) ;; *) out="$here/$out" ;; esac
if [ $# -gt 0 ]; then export KILL_MATRIX_ONLY="$1"; fi
export KILL_MATRIX_OUT="$out"
# The whole job frozen and taken over, every strategy that writes a store, first: its
# coordinator cannot run inside the matrix's test process (crates/cli/tests/frozen.rs); its
# results reach the matrix's pause column through KILL_MATRIX_FROZEN. A failure there shows in
# the table (and fails the matrix) rather than stopping the script.
frozen="$(mktemp)"
trap 'rm -f "$frozen"' EXIT
export KILL_MATRIX_FROZEN="$frozen"
CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}" cargo test -p ftrec-cli --test frozen \
    every_strategy_frozen_and_taken_over -- --ignored --test-threads 1 || true
CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}" cargo test -p ftrec-cluster --test kill_matrix \
    kill_matrix_full -- --ignored --nocapture --test-threads 1
echo "kill matrix written to $out"
