#!/usr/bin/env bash
# Runs every example of the README, the long ones (marked `<!-- readme-test: long -->`)
# included, in order in one fresh directory with the release build of `ftrec` first on PATH:
# the demo, the benchmarks, the `small` runs. Tens of minutes on two cores; the default suite
# (scripts/test.sh) runs the others.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
exec cargo test --release -p ftrec-cli --test readme -- --ignored --nocapture \
    the_readme_s_long_examples_run_as_written
