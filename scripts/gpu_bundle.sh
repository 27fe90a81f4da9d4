#!/usr/bin/env bash
# Builds titan with the CUDA backend here (nvcc, no GPU needed) and packs what the GPU machine needs
# into .gpu/bundle.tar.xz (with the tracked files, under the 64 MiB the device tool carries):
#   bin/    titan, the CUDA test programs (tests/backend/cuda*_test.cpp), the CUDA benchmarks
#   lib/    libtitan.so.MAJOR.MINOR, libtitan_cuda.so (the CUDA backend, loaded on first use of device cuda)
#           and every shared library they load that the GPU machine may lack (oneDNN,
#           OpenBLAS, OpenMP, MPI, ICU, PCRE2, toml++, ...), found with ldd. Left out: glibc's own
#           libraries and the C++ runtime (every Linux with Python has them), and the CUDA
#           libraries (cudart, cuBLAS/cuBLASLt, cuDNN, NCCL), which come from the GPU machine's
#           PyTorch wheels so that they match its driver;
#   scripts/gpu_check.sh, bench/gpu_models.sh (the speed floors), the peer's harness when
#   ../shared/peers/h200 is there, configs/, the small test fixtures, and the tokenizer and corpus of assets/
#   (a short debugmodel training run on the GPU against the CPU), and reference/ the CPU's side of
#   that run, trained here.
# On the GPU machine:  mkdir -p /tmp/t && tar xf bundle.tar.xz -C /tmp/t && bash /tmp/t/titan-gpu/scripts/gpu_check.sh
#   (where xz is missing: python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])'
#   bundle.tar.xz /tmp/t)
#
#   bash scripts/gpu_bundle.sh              # build dir: build/
#   TITAN_GPU_BUILD=build-gpu bash scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TITAN_GPU_BUILD:-build}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu_bundle: nvcc not found" >&2; exit 1; }

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTITAN_CUDA=ON >/dev/null
grep -q '^TITAN_CUDA:BOOL=ON' "$build/CMakeCache.txt" || { echo "gpu_bundle: CUDA backend not enabled" >&2; exit 1; }
tests=$(cd tests/backend && ls cuda*_test.cpp | sed 's/\.cpp$//')
benches=$(cd bench && ls cuda_*_bench.cpp 2>/dev/null | sed 's/\.cpp$//' || true)
# shellcheck disable=SC2086
ninja -C "$build" -j"$(nproc)" titan_cli titan_cuda $tests $benches

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/titan-gpu
mkdir -p "$root/bin" "$root/lib" "$root/scripts" "$root/tests"
cp "$build/bin/titan" "$root/bin/"
for t in $tests; do cp "$build/tests/$t" "$root/bin/"; done
for b in $benches; do cp "$build/bin/$b" "$root/bin/"; done
# libtitan under its SONAME (libtitan.so.MAJOR.MINOR), the name the programs ask the loader for.
titan_lib=$(objdump -p "$build/src/titan/libtitan.so" | awk '$1 == "SONAME" {print $2}')
[ -n "$titan_lib" ] || { echo "gpu_bundle: libtitan.so has no SONAME" >&2; exit 1; }
cp -L "$build/src/titan/libtitan.so" "$root/lib/$titan_lib"
cp "$build/src/titan/libtitan_cuda.so" "$root/lib/"
# Debug info is most of the size; the GPU machine needs symbols only for backtraces.
strip --strip-debug "$root"/bin/* "$root/lib/$titan_lib" "$root"/lib/libtitan_cuda.so

# Shared libraries: everything ldd resolves, minus glibc, the C++ runtime and the CUDA libraries.
skip='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64|linux-vdso|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libcuda|libnvidia.*)\.so'
for f in "$root"/bin/* "$root/lib/$titan_lib" "$root/lib/libtitan_cuda.so"; do
  ldd "$f" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  [[ $name == "$titan_lib" || $name == libtitan_cuda.so ]] && continue
  cp -L "$path" "$root/lib/$name"
done

cp scripts/gpu_check.sh "$root/scripts/"
mkdir -p "$root/bench" && cp bench/gpu_models.sh "$root/bench/"
# The PyTorch peer's H200 harness (../shared/peers/h200, not project code), for GPU_CHECK_PEER=1.
if [ -f ../shared/peers/h200/torch_baseline.py ]; then
  mkdir -p "$root/peers/h200" && cp ../shared/peers/h200/*.py "$root/peers/h200/"
fi
cp -r configs "$root/"
cp -r tests/fixtures "$root/tests/"
[ -f assets/.complete ] || { echo "gpu_bundle: assets/ is not prepared (run scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$root/assets"
cp -r assets/.complete assets/tokenizer assets/datasets "$root/assets/"

# The CPU's side of gpu_check.sh's debugmodel comparison, run here so that no device time goes to it
# (the same arguments as gpu_check.sh's GPU run, --job.device=cpu).
mkdir -p "$root/reference"
"$build/bin/titan" train --config configs/debugmodel.toml --training.steps=10 --checkpoint.enable=false \
  --checkpoint.last_save_in_hf=false --metrics.log_freq=1 --job.device=cpu --job.dump_folder="$stage/train_cpu" \
  >"$root/reference/train_debugmodel_cpu.log" 2>&1 ||
  { tail -20 "$root/reference/train_debugmodel_cpu.log" >&2; echo "gpu_bundle: the CPU debugmodel run failed" >&2; exit 1; }

mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz titan-gpu
size=$(stat -c %s .gpu/bundle.tar.xz)
echo "gpu_bundle: .gpu/bundle.tar.xz $((size / 1024 / 1024)) MiB ($(ls "$root/lib" | wc -l) libraries, $(ls "$root/bin" | wc -l) programs)"
# The device tool carries at most 64 MiB: the bundle and every tracked file of the checkout together.
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
limit=$((64 * 1024 * 1024 - tracked - 1024 * 1024))
[ "$size" -lt "$limit" ] ||
  { echo "gpu_bundle: bundle $((size / 1024 / 1024)) MiB + tracked files $((tracked / 1024 / 1024)) MiB is over the 64 MiB the device tool carries" >&2; exit 1; }
# .gpu/ is git-ignored: the device tool copies it only when the call names it in `carry`.
echo "gpu_bundle: run on the GPU machine with carry [\".gpu\"] (python3's tarfile where there is no xz):"
echo "  mkdir -p /tmp/t && { tar xf .gpu/bundle.tar.xz -C /tmp/t || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .gpu/bundle.tar.xz /tmp/t; } && bash /tmp/t/titan-gpu/scripts/gpu_check.sh"
