#!/usr/bin/env bash
# Set-up, build everything (library, CLI, tests, benchmarks), run the whole test suite.
# Ends with ctest's summary line ("100% tests passed, 0 tests failed out of N").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
