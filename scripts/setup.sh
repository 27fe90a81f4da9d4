#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages, then the
# npm assets (tokenizer + corpus). Safe to run again; does nothing already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libdnnl-dev libopenblas-dev nlohmann-json3-dev libtomlplusplus-dev libpcre2-dev libicu-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  python3 python3-torch python3-numpy
  python3-jinja2  # the chat template rendered as transformers renders it (tests/data/chat_test.cpp)
  zlib1g-dev   # gzip-compressed datasets (src/titan/data/text_stream.cpp)
  libzstd-dev  # zstd-compressed datasets (.zst: SlimPajama, Dolma, RedPajama shards), zstd Parquet pages
  libsnappy-dev libbrotli-dev liblz4-dev  # Parquet pages' other codecs (src/titan/data/parquet.cpp)
  chromium     # the browser check of `titan report` (tests/train/report_test.cpp)
  clang-format # `git clang-format`, the formatting of every change (CONTRIBUTING.md)
)
missing=()
for p in "${PACKAGES[@]}"; do
  # The status is captured, not piped into `grep -q`: under pipefail a reader that stops early can
  # fail the pipe (tests/install/install_test.sh had that flake).
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == *"install ok installed"* ]] || missing+=("$p")
done
# node + npm fetch the tokenizer and corpus; the machine image may already ship them.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -x scripts/fetch_assets.sh ]; then
  scripts/fetch_assets.sh
fi
