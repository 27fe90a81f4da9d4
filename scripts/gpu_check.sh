#!/usr/bin/env bash
# Runs on the GPU machine from an unpacked bundle (scripts/gpu_bundle.sh made it): the GPU's
# identity, the CUDA test programs (cuda_nccl_test among them: every NCCL collective in a world of
# one rank, and over `mpirun -np 2` when the machine has two GPUs and mpirun),
# `titan kernels parity --device cuda`,
# 10 steps of the debug model on the GPU beside the CPU's (run when the bundle was made), the CUDA
# benchmarks and the speed floors (bench/gpu_models.sh: the peer's 0.6B, MoE and 4B jobs), each
# under a time limit, then prints a short summary table LAST.
#
#   mkdir -p /tmp/t && tar xf bundle.tar.xz -C /tmp/t && bash /tmp/t/titan-gpu/scripts/gpu_check.sh
#   GPU_CHECK_SKIP_BENCH=1 bash .../gpu_check.sh      # tests and parity only
#   GPU_CHECK_SKIP_MODELS=1 bash .../gpu_check.sh     # everything but bench/gpu_models.sh
#   GPU_CHECK_MODELS="0.6B MoE 4B"                    # the floors' jobs with the default kernels
#   GPU_CHECK_MODELS_VARIANTS="0.6B+wmma ..."         # the same with other kernels (after the tests)
#   GPU_CHECK_PEER=1 bash .../gpu_check.sh            # also the peer (transformers, eager) in the same
#                                                     # call, GPU_CHECK_PEER_BUDGET seconds (default 60)
#   GPU_CHECK_LOG_DIR=$OUT bash .../gpu_check.sh      # keep each step's full log there
#   GPU_CHECK_LOG_DIR=/tmp/logs GPU_CHECK_ARCHIVE=$OUT/gpu_logs.tar.gz ...
#                                                     # pack the logs, profiles and traces into one
#                                                     # file (the device tool returns at most 8 files)
#   GPU_CHECK_DEADLINE=530 bash .../gpu_check.sh      # seconds for the whole script (default 530:
#                                                     # the device tool's 600 s per call, less the
#                                                     # unpacking, the archive and kill grace)
# The steps run in the order of what a short slot must not miss: the quick CUDA test programs (the
# device services, the GEMMs, the basic ops: if they fail, nothing after them means much), the
# parity command, the speed floors with the default kernels (with the GEMM ceiling they are
# measured against), the debug model on both devices (end to end, a few seconds), the other CUDA
# test programs, the floors' jobs with the other kernel variants, the other benchmarks. Every step's time limit is cut to what is left of the deadline, and a step with
# under 15 s left is skipped, so the summary always prints. A step past its limit gets SIGTERM and,
# 10 s later, SIGKILL (titan train stops at a step boundary on SIGTERM, which a hung kernel never
# reaches).
# Exit status: 0 when every step passed (skips count as passes only for the benchmarks).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
logs=${GPU_CHECK_LOG_DIR:-$root/logs}
# Every figure comes from this run: the logs of an earlier run (a rerun on a machine still warm) are
# moved aside, so that a step this run skips cannot show the earlier run's table as its own.
if [ -d "$logs" ] && [ -n "$(ls -A "$logs")" ]; then
  mv "$logs" "$logs.before-$(date +%s)" && echo "gpu_check: the previous logs in $logs moved aside"
fi
mkdir -p "$logs"

# The bundle's libraries first, then the CUDA libraries of the machine's PyTorch wheels
# (site-packages/nvidia/*/lib), then a system CUDA toolkit if there is one.
libpath=$root/lib
nvidia_dir=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -n "$nvidia_dir" ]; then
  for d in "$nvidia_dir"/nvidia/*/lib "$nvidia_dir"/nvidia/*/lib64; do [ -d "$d" ] && libpath=$libpath:$d; done
fi
[ -d /usr/local/cuda/lib64 ] && libpath=$libpath:/usr/local/cuda/lib64
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# The test programs find the fixtures, assets, configs and bin/titan in the bundle (tests/test_util.h).
export TITAN_TEST_SOURCE_DIR=$root TITAN_TEST_BINARY_DIR=$root

summary=()
failed=0
started=$(date +%s)
deadline=${GPU_CHECK_DEADLINE:-530}
# step NAME LIMIT_SECONDS CMD...: runs CMD, logs its output, records PASS / FAIL / SKIP and the time.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - ($(date +%s) - started)))
  if [ "$left" -lt 15 ]; then
    summary+=("$(printf '%-34s %-22s' "$name" "SKIP (deadline: ${left}s left)")")
    case "$name" in *_bench) ;; *) failed=1 ;; esac  # a test or a job that never ran did not pass
    return
  fi
  [ "$limit" -gt $((left - 10)) ] && limit=$((left - 10))  # room for the SIGKILL grace
  local log=$logs/${name//[^A-Za-z0-9_.-]/_}.log start end rc status detail
  echo "=== $name: $*"
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  tail -n 40 "$log"
  if [ $rc -eq 0 ]; then status=PASS; else status=FAIL; failed=1; fi
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status="FAIL (timeout ${limit}s)"
  detail=""
  if grep -q '^\[==========\] .* ran\.' "$log"; then  # a GoogleTest program: count its tests
    local ok skipped bad
    ok=$(grep -cE '^\[       OK \] .*\([0-9]+ ms\)$' "$log")
    skipped=$(grep -cE '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$log")
    bad=$(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$log")
    detail="$ok ok, $skipped skipped, $bad failed"
    [ "$status" = PASS ] && [ "$skipped" -gt 0 ] && [ "$ok" -eq 0 ] && status=SKIP
  elif grep -qE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log"; then  # titan kernels parity, per op
    local p f s
    read -r p f s < <(awk '/^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped/{p += $1; f += $3; s += $5}
                           END {print p + 0, f + 0, s + 0}' "$log")
    detail="$p passed, $f failed, $s skipped"
    if [ "$status" = PASS ] && [ "$p" -eq 0 ]; then status=SKIP; failed=1; fi  # nothing checked: no GPU
  elif [ "$status" = PASS ] && grep -q ': skipped: ' "$log"; then
    status=SKIP
    detail=$(grep -m1 ': skipped: ' "$log" | sed 's/^[^:]*: skipped: //')
  fi
  summary+=("$(printf '%-34s %-22s %7.1fs  %s' "$name" "$status" "$(awk "BEGIN{print $end - $start}")" "$detail")")
}

echo "=== machine"
timeout -k 5 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || failed=1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
timeout -k 5 60 "$root/bin/titan" version --cuda || failed=1  # loads the CUDA backend: its runtime, driver and GPUs
missing=$(ldd "$root"/bin/* "$root"/lib/libtitan.so.* "$root"/lib/libtitan_cuda.so 2>/dev/null | grep 'not found' | sort -u)
if [ -n "$missing" ]; then
  echo "missing libraries:"; echo "$missing"; failed=1
fi

# The quick test programs first (each well under a minute when the kernels work).
quick_tests="cuda_test cuda_services_test cuda_gemm_test"
for name in $quick_tests; do
  [ -x "$root/bin/$name" ] && step "$name" 60 "$root/bin/$name" --gtest_color=no --gtest_filter='-*Mma*:*Cudnn*'
done

# One process per op: a kernel fault (sticky for the CUDA context) then costs one op's lines, not
# every op after it.
# (The ops of i64 only, `index`'s argument scans and `expert_counts`' histogram, have no floating
# dtype for parity to compare: cuda_ops_test and cuda_model_ops_test check them.) No CUDA
# op listed means the backend did not load: a FAIL, never a pass over nothing.
cuda_ops=$(timeout -k 5 60 "$root/bin/titan" kernels list 2>/dev/null | awk '$3 == "cuda" && $4 !~ /^i64/ {print $1}' | sort -u)
# shellcheck disable=SC2086
step "titan kernels parity --device cuda" 180 bash -c '
  titan=$1; shift
  [ $# -gt 0 ] || { echo "no cuda kernels listed: the CUDA backend did not load"; exit 1; }
  rc=0
  # Each op under its own limit: a kernel that hangs costs 40 s and its own lines, and the ops
  # after it still run. (--foreground keeps it in the step'"'"'s process group, so the step'"'"'s own
  # limit kills it too: a plain timeout would leave it running on the GPU beside the next steps.)
  for op in "$@"; do
    timeout --foreground -k 5 40 "$titan" kernels parity --device cuda --op "$op"
    r=$?
    if [ $r -eq 124 ] || [ $r -eq 137 ]; then echo "op $op: timed out after 40 s"; rc=1; elif [ $r -ne 0 ]; then rc=1; fi
  done
  exit $rc' parity "$root/bin/titan" $cuda_ops

# The bf16 GEMM ceiling the speed floors' MFU is measured against.
bench_tables=()
if [ -z "${GPU_CHECK_SKIP_BENCH:-}" ] && [ -x "$root/bin/cuda_gemm_bench" ]; then
  step cuda_gemm_bench 120 "$root/bin/cuda_gemm_bench"
  bench_tables+=("$logs/cuda_gemm_bench.log")
fi

# The speed floors: the peer's three jobs (0.6B, MoE, 4B) trained by titan on the GPU, with MFU also
# against the bf16 GEMM ceiling cuda_gemm_bench just measured. The default kernels first; the same
# jobs with the other kernel variants (+bf16grads, +wide, +cudnn, +wmma, +mma) after the tests, while time is left.
# models_step NAME JOBS LIMIT: one run of bench/gpu_models.sh; its table is added to models_table.
# Each job may run 60 s (a 4B job, the longest, should take 20-30: a few seconds of start-up, a first
# step under 5 s, ten steps of a quarter second); the step's limit is the jobs' limits added up (and a little for the table),
# so the last job of a step is cut by its own limit (a FAILED row) rather than by the step's.
models_table=""
models_step() {
  local name=$1 jobs=$2 log table
  local job_limit=60 n
  n=$(wc -w <<<"$jobs")
  step "$name" $((n * (job_limit + 10) + 15)) env GPU_MODELS="$jobs" GPU_MODELS_JOB_LIMIT=$job_limit CUDNN_LOGLEVEL_DBG=1 \
    CUDNN_LOGDEST_DBG="$logs/cudnn_${name//[^A-Za-z0-9_.-]/_}_errors.log" bash "$root/bench/gpu_models.sh" \
    "$root/bin/titan" "$logs/gpu_models"
  log=$logs/${name//[^A-Za-z0-9_.-]/_}.log
  [ -f "$log" ] || return 0
  table=$(sed -n '/^--- titan on the GPU/,$p' "$log")
  # Cut short by its limit: the rows of the jobs it finished.
  [ -z "$table" ] && table=$(printf -- '--- titan on the GPU (%s cut short; the jobs that ran)\n' "$name"; \
    sed -n 's/^row: //p' "$log")
  models_table+="$table"$'\n'
}
run_models=""
if [ -z "${GPU_CHECK_SKIP_BENCH:-}" ] && [ -z "${GPU_CHECK_SKIP_MODELS:-}" ]; then
  run_models=1
  gemm=$(awk '/gemm bf16 8192\^3/{print $(NF-1)}' "$logs/cuda_gemm_bench.log" 2>/dev/null | tail -1)
  export GPU_MODELS_GEMM_TFLOPS=${gemm:-0}
  models_step "gpu_models default kernels" "${GPU_CHECK_MODELS:-0.6B MoE 4B}"
fi

# The debug model, 10 steps on each device from the same seed: the GPU's losses must follow the
# CPU's within bf16 tolerance (compared by eye here; the table below shows both).
train_args=(train --config "$root/configs/debugmodel.toml" --training.steps=10 --checkpoint.enable=false
            --checkpoint.last_save_in_hf=false --metrics.log_freq=1)
step "train debugmodel cuda (10 steps)" 240 "$root/bin/titan" "${train_args[@]}" --job.device=cuda \
  --job.dump_folder="$logs/train_cuda"
# The CPU's side was run by gpu_bundle.sh when it made the bundle (no device time spent on it); a
# bundle without it runs it here.
if [ -f "$root/reference/train_debugmodel_cpu.log" ]; then
  cp "$root/reference/train_debugmodel_cpu.log" "$logs/train_debugmodel_cpu__10_steps_.log"
else
  step "train debugmodel cpu (10 steps)" 120 "$root/bin/titan" "${train_args[@]}" --job.device=cpu \
    --job.dump_folder="$logs/train_cpu"
fi
# (a run skipped by the deadline has no log: no table, and no awk error in the output's tail)
losses=$(join <(awk '/^step:/{print $2, $4}' "$logs/train_debugmodel_cpu__10_steps_.log" 2>/dev/null | sort -k1,1) \
              <(awk '/^step:/{print $2, $4}' "$logs/train_debugmodel_cuda__10_steps_.log" 2>/dev/null | sort -k1,1) \
              2>/dev/null | sort -n)

# The cases of the kernels never yet run on a GPU (named *Mma*: the mma_sync kernels; *Cudnn*: cuDNN's
# fused attention) run in processes of their own, after the rest: a fault in one of them cannot take
# the default kernels' cases down with it.
for t in "$root"/bin/cuda*_test; do
  [ -x "$t" ] || continue
  case " $quick_tests " in *" $(basename "$t") "*) continue ;; esac  # ran first
  step "$(basename "$t")" 180 "$t" --gtest_color=no --gtest_filter='-*Mma*:*Cudnn*'
done
for pattern in Mma Cudnn; do
  for t in "$root"/bin/cuda*_test; do
    [ -x "$t" ] || continue
    # (grep reads the whole list: an early exit of grep -q would fail the pipe under pipefail)
    [ -n "$(timeout -k 5 30 "$t" --gtest_list_tests --gtest_filter="*$pattern*" 2>/dev/null | grep '^  ')" ] || continue
    # cuDNN's own account of each engine configuration it tries (warnings and errors) goes to a log
    # of its own, archived with the rest: what a failing plan build needs to be fixed.
    step "$(basename "$t") ($pattern)" 180 env CUDNN_LOGLEVEL_DBG=2 \
      CUDNN_LOGDEST_DBG="$logs/cudnn_$(basename "$t")_$pattern.log" "$t" --gtest_color=no --gtest_filter="*$pattern*"
  done
done

[ -n "$run_models" ] &&
  models_step "gpu_models other kernels" "${GPU_CHECK_MODELS_VARIANTS:-0.6B+bf16grads MoE+bf16grads 4B+bf16grads MoE+wide MoE+cudnn 0.6B+wmma MoE+wmma 0.6B+mma MoE+mma 4B+wmma 0.6B+docs}"

if [ -z "${GPU_CHECK_SKIP_BENCH:-}" ]; then
  for b in "$root"/bin/cuda_*_bench; do
    [ -x "$b" ] && [ "$(basename "$b")" != cuda_gemm_bench ] || continue
    step "$(basename "$b")" 120 "$b"
    bench_tables+=("$logs/$(basename "$b").log")
  done
fi

# The peer in the same call (the bundle's copy of shared/peers/h200): transformers eager on the same
# three jobs; its torch.compile runs start only while the budget lasts (their warm-up is 80-143 s).
peer_table=""
if [ -n "${GPU_CHECK_PEER:-}" ] && [ -f "$root/peers/h200/torch_baseline.py" ]; then
  mkdir -p "$logs/peer"
  # (Without the bundle's Debian libraries first in the path: the peer's torch brings its own.)
  step "peer torch_baseline.py" 300 env LD_LIBRARY_PATH="${LD_LIBRARY_PATH#"$root/lib:"}" OUT="$logs/peer" \
    BUDGET="${GPU_CHECK_PEER_BUDGET:-60}" \
    python3 "$root/peers/h200/torch_baseline.py"
  [ -f "$logs/peer/torch_baseline.json" ] && peer_table=$(python3 - "$logs/peer/torch_baseline.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])).get("runs", []):
    if "tokens_per_s" in r:
        print(f"{r['name']:<32} {r['tokens_per_s'] / 1e3:7.1f}k tok/s {r['peak_mem_gib']:6.1f} GiB "
              f"first step {r['first_step_s']:6.1f}s  MFU989 {100 * r['mfu_vs_989']:4.1f}%")
    else:
        print(f"{r['name']:<32} {r.get('skipped') or r.get('error', '')}")
EOF
)
fi

echo
for f in "${bench_tables[@]}"; do
  [ -f "$f" ] || continue  # skipped by the deadline: no log
  echo "--- $(basename "$f" .log)"
  cat "$f"
done
[ -n "$peer_table" ] && { echo "--- peer in this call (transformers 5.17, bf16 autocast)"; echo "$peer_table"; }
[ -n "$models_table" ] && printf '%s' "$models_table"
if [ -n "$losses" ]; then
  echo "--- debugmodel losses (step, cpu, cuda)"
  echo "$losses"
fi
if [ -n "${GPU_CHECK_ARCHIVE:-}" ]; then
  tar -C "$logs" -czf "$GPU_CHECK_ARCHIVE" . && echo "logs, profiles and traces: $GPU_CHECK_ARCHIVE ($(du -h "$GPU_CHECK_ARCHIVE" | cut -f1))"
fi
echo
echo "=== gpu_check summary ($(timeout -k 5 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%s\n' "${summary[@]}"
exit $failed
