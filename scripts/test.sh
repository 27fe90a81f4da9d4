#!/usr/bin/env bash
# Set-up, build everything (library, CLI, tests, benchmarks), run the whole test suite.
# Ends with ctest's summary line ("100% tests passed, 0 tests failed out of N").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# The free disk, for a run that fails writing: the suite needs about 1 GiB at a time (every test
# removes its folders when it passes; a failing one keeps them under build/test_tmp).
echo "test.sh: $(df -h --output=avail build | tail -1 | tr -d ' ') free on the disk of build/"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
