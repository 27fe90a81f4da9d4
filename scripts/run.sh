#!/usr/bin/env bash
# The main job: set-up, build, then train configs/debugmodel.toml on CPU (a few minutes on 2 cores).
# Extra arguments are passed to `titan train`, e.g. --training.steps=10.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TITAN_BUILD_TARGETS=titan_cli bash scripts/build.sh
exec ./build/bin/titan train --config configs/debugmodel.toml "$@"
