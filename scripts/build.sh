#!/usr/bin/env bash
# Configures and builds titan.cpp into build/ (Release with debug info, Ninja, ccache when present).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
ninja -C build -j"$(nproc)" "${TITAN_BUILD_TARGETS:-all}"
