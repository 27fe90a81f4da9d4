#!/usr/bin/env bash
# Installs titan from BUILD_DIR into a fresh prefix, builds examples/train_debugmodel against the
# installed package only (find_package(titan), titan::titan), runs it, and checks that it trained;
# then builds it against the build tree's package (-Dtitan_DIR=BUILD_DIR) and checks what it loads.
# usage: install_test.sh SOURCE_DIR BUILD_DIR WORK_DIR CXX_COMPILER
set -euo pipefail
src=$1 build=$2 work=$3 cxx=$4
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in bin/titan include/titan/models/qwen3/model.h include/titan/train/trainer.h share/doc/titan/README.md \
  share/doc/titan/docs/training.md; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
config=$(find "$prefix" -name titanConfig.cmake)
[ -n "$config" ] || { echo "FAIL: no titanConfig.cmake under $prefix"; exit 1; }
"$prefix/bin/titan" kernels list >/dev/null || { echo "FAIL: the installed titan does not run"; exit 1; }
# With the CUDA backend: its library is installed beside libtitan and the installed titan loads it
# from there (it needs no GPU to load).
if [ -e "$build/src/titan/libtitan_cuda.so" ]; then
  cuda_lib=$(find "$prefix" -name libtitan_cuda.so)
  [ -n "$cuda_lib" ] && [ -e "$(dirname "$cuda_lib")/libtitan.so" ] ||
    { echo "FAIL: libtitan_cuda.so is not installed beside libtitan.so"; exit 1; }
  LD_DEBUG=libs "$prefix/bin/titan" version --cuda >"$work/version_cuda.log" 2>&1 ||
    { echo "FAIL: the installed titan cannot load its CUDA backend"; tail "$work/version_cuda.log"; exit 1; }
  grep -q "calling init: $prefix/.*libtitan_cuda.so" "$work/version_cuda.log" ||
    { echo "FAIL: the installed titan did not load the installed libtitan_cuda.so"; grep libtitan_cuda "$work/version_cuda.log"; exit 1; }
fi

cmake -S "$src/examples/train_debugmodel" -B "$work/example" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log"
# The example must see the installed headers, never the source tree's.
if grep -q -- "$src/src" "$work/example/build.ninja"; then
  echo "FAIL: the example's build refers to $src/src"; exit 1
fi
cmake --build "$work/example" >"$work/build.log"
# Captured first: `ldd | grep -q` under pipefail fails whenever grep exits before ldd has written
# everything (ldd dies of SIGPIPE), which made this check flaky.
libs=$(ldd "$work/example/train_debugmodel")
grep -q "$prefix/.*libtitan.so" <<<"$libs" ||
  { echo "FAIL: the example does not load the installed libtitan.so"; echo "$libs"; exit 1; }

# The consumer sees titan's dependencies only where titan's public headers need them: no OpenMP,
# MPI, oneDNN or OpenBLAS flags or include folders (libtitan keeps them to itself).
if grep -qE -- '-fopenmp|openmpi|dnnl|openblas' "$work/example/build.ninja"; then
  echo "FAIL: titan::titan hands the example a private dependency:"
  grep -oE -- '-fopenmp|[^ ]*openmpi[^ ]*|[^ ]*dnnl[^ ]*|[^ ]*openblas[^ ]*' "$work/example/build.ninja" | sort -u
  exit 1
fi
# libtitan carries a versioned SONAME, and the example asks for it.
soname=$(objdump -p "$work/example/train_debugmodel" | awk '$1 == "NEEDED" && $2 ~ /^libtitan\.so/ {print $2}')
[[ $soname =~ ^libtitan\.so\.[0-9]+\.[0-9]+$ ]] ||
  { echo "FAIL: the example needs '$soname', not libtitan.so.MAJOR.MINOR"; exit 1; }

# The build tree is a package too (-Dtitan_DIR=BUILD_DIR), without installing.
cmake -S "$src/examples/train_debugmodel" -B "$work/example_build_tree" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$cxx" -Dtitan_DIR="$build" >"$work/configure_build_tree.log"
cmake --build "$work/example_build_tree" >"$work/build_build_tree.log"
libs=$(ldd "$work/example_build_tree/train_debugmodel")
grep -q "$build/.*libtitan.so" <<<"$libs" ||
  { echo "FAIL: the build-tree example does not load the build's libtitan.so"; echo "$libs"; exit 1; }

# A project that adds the source tree with add_subdirectory gets titan::titan and titan's program,
# not its tests, benchmarks or install rules. Configured, and the example's own object compiled
# (titan's include folders reach it through titan::titan); building libtitan again here would take
# as long as the build itself, so the link is checked on the link command.
super=$work/superproject
mkdir -p "$super"
cat >"$super/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(superproject LANGUAGES CXX)
add_subdirectory("$src" titan)
add_executable(train_debugmodel "$src/examples/train_debugmodel/main.cpp")
target_link_libraries(train_debugmodel PRIVATE titan::titan)
CMAKE
cmake -S "$super" -B "$super/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  >"$work/configure_superproject.log"
targets=$(ninja -C "$super/build" -t targets all)
for t in titan_cli train_debugmodel; do
  grep -q "^$t: " <<<"$targets" || { echo "FAIL: add_subdirectory: no target $t"; exit 1; }
done
extra=$(grep -E '^(install|[^:]*_test|[^:]*_bench|[^:]*gtest[^:]*): ' <<<"$targets" || true)
[ -z "$extra" ] || { echo "FAIL: add_subdirectory brings titan's tests, benchmarks or install rules:"; head <<<"$extra"; exit 1; }
object=$(grep -o '^CMakeFiles/train_debugmodel.dir/[^:]*main.cpp.o' <<<"$targets")
ninja -C "$super/build" "$object" >"$work/build_superproject.log" ||
  { echo "FAIL: add_subdirectory: the example does not compile"; tail "$work/build_superproject.log"; exit 1; }
link=$(ninja -C "$super/build" -t commands train_debugmodel | tail -n 1)
grep -q " titan/src/titan/libtitan.so" <<<"$link" ||
  { echo "FAIL: add_subdirectory: the example does not link the subproject's libtitan"; echo "$link"; exit 1; }
echo "add_subdirectory: titan::titan configured, the example compiled against it"

TITAN_ASSETS_DIR="$src/assets" "$work/example/train_debugmodel" 6 | tee "$work/run.log"
steps=$(grep -c '^step ' "$work/run.log")
[ "$steps" -eq 6 ] || { echo "FAIL: $steps steps logged, expected 6"; exit 1; }
# Trained: the loss of the last step is below the first step's.
awk '/^step /{ if (!first) first = $4; last = $4 }
     END { if (last + 0 < first + 0) { print "PASS: loss " first " -> " last; exit 0 }
           print "FAIL: the loss did not fall: " first " -> " last; exit 1 }' "$work/run.log"
