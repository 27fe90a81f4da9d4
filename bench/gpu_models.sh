#!/usr/bin/env bash
# The speed floors of the CUDA backend (issue: "CUDA backend on the H200"): titan trains the peer's
# three jobs on one GPU, from random init, bf16 mixed precision with f32 master weights, AdamW and
# grad-norm clipping at 1.0, exactly the shapes of shared/peers/h200/torch_baseline.py:
#   Qwen3-0.6B, 8 x 2048;  Qwen3-4B, 2 x 2048;  Qwen3-30B-A3B dims with 4 layers, 64 experts, top-4, 8 x 2048
# and prints one table: start-up + first step ("to 1st"), first step, median step after the warm-up, tokens/s, TFLOP/s and MFU (by
# the peer's formula, 6N + 12 L H hd S with lm_head counted), peak GPU memory, the peer's
# torch.compile figure and the ratio to it, and the floor.
#
#   bash bench/gpu_models.sh [TITAN] [OUT_DIR]
#     TITAN    the titan binary (default: bin/titan of a bundle, else build/bin/titan)
#     OUT_DIR  where each run's dump folder and log go (default: a temporary folder)
#   GPU_MODELS="0.6B MoE 4B"   which jobs, in this order (default: "0.6B 0.6B+bf16grads 0.6B+wmma MoE
#                              MoE+bf16grads MoE+wide MoE+cudnn 4B 4B+bf16grads 4B+wmma 0.6B+mma
#                              MoE+mma 0.6B+docs"); the plain name runs the job's
#                              defaults (on cuda: cuDNN's fused attention, the mma_sync expert GEMMs);
#                              a name ending in +mma runs it with the mma_sync attention kernels (and,
#                              for MoE, the mma_sync grouped expert GEMMs), +wide (MoE) with the
#                              expert GEMMs on mma_sync_wide's 128 x 256 tiles, +wmma with titan's WMMA
#                              attention (and WMMA expert GEMMs), +cudnn with cuDNN's fused attention
#                              (and, for MoE, cuDNN's grouped matmul for the experts' row GEMMs):
#                              [kernels] rules appended to a copy of its config, to see which the GPU
#                              prefers; one ending in +bf16grads with
#                              training.activation_grad_dtype = "bfloat16" (bf16 activation
#                              gradients, as torch autocast's); one ending in +docs
#                              with model.attn_mask_type = "block_causal" (attention cut at the
#                              corpus's documents: one launch per document), to see what those cost
#   GPU_MODELS_STEPS=10        steps per job (the first 3 are warm-up, as the peer's); one step is
#                              profiled op by op, the one before the last (the last when STEPS <= 4)
#                              ([profiling]: its table follows the job's log tail, its Chrome trace is
#                              in OUT_DIR/<job>/profile_traces); it stays in the median's sample
#   GPU_MODELS_AC=none         activation checkpointing mode for every job (none | selective | full)
#   GPU_MODELS_GEMM_TFLOPS=X   the measured bf16 GEMM ceiling (cuda_gemm_bench), for a second MFU
#   GPU_MODELS_JOB_LIMIT=600   seconds each job may run (a job past it is a FAILED row: SIGTERM,
#                              then SIGKILL 10 s later)
#   PEER_JSON=FILE             a torch_compile.json measured in the same run, instead of the
#                              2026-11-29 figures below
# Exit status: non-zero when a job failed to run (a floor that is missed is reported, not fatal:
# a benchmark measures).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
titan=${1:-}
if [ -z "$titan" ]; then
  if [ -x "$root/bin/titan" ]; then titan=$root/bin/titan; else titan=$root/build/bin/titan; fi
fi
out=${2:-$(mktemp -d /tmp/titan-gpu-models.XXXXXX)}
mkdir -p "$out"
steps=${GPU_MODELS_STEPS:-10}
profile_step=$((steps > 4 ? steps - 1 : steps))  # [profiling] times this step op by op (after the warm-up)
ac=${GPU_MODELS_AC:-none}
models=${GPU_MODELS:-0.6B 0.6B+bf16grads 0.6B+wmma MoE MoE+bf16grads MoE+wide MoE+cudnn 4B 4B+bf16grads 4B+wmma 0.6B+mma MoE+mma 0.6B+docs}

# Per job: its config, its other titan arguments, the peer's torch.compile figures (2026-11-29)
# and the floors.
job_config() {
  case $1 in 0.6B | 4B) echo "$root/configs/qwen3_0.6b.toml" ;; MoE) echo "$root/configs/qwen3_30b_a3b_reduced.toml" ;; esac
}
job_args() {
  case $1 in
    0.6B) echo "--training.local_batch_size=8 --training.global_batch_size=8" ;;
    4B) echo "--model.flavor=4B --training.local_batch_size=2 --training.global_batch_size=2" ;;
    MoE) echo "--training.local_batch_size=8 --training.global_batch_size=8" ;;
  esac
}
peer_default() {  # tokens/s, GiB of transformers 5.17 + torch.compile on the H200 (shared/peers/h200)
  case $1 in 0.6B) echo "71.0e3 48.2" ;; 4B) echo "14.1e3 76.1" ;; MoE) echo "72.0e3 42.5" ;; esac
}
peer_name() {
  case $1 in 0.6B) echo "qwen3-0.6B compile" ;; 4B) echo "qwen3-4B compile" ;; MoE) echo "qwen3-moe-4L-64E-top4 compile" ;; esac
}
floor() {  # tokens/s and GiB (0: no memory floor)
  case $1 in 0.6B) echo "92e3 48" ;; 4B) echo "17.6e3 0" ;; MoE) echo "108e3 0" ;; esac
}

failed=0
rows=()
for name in $models; do
  m=${name%%+*}
  variant=${name#"$m"}
  dump=$out/$name
  rm -rf "$dump"
  config=$(job_config "$m")
  variant_args=()
  if [ "$variant" = +docs ]; then  # the same job, attention within each document
    variant_args=(--model.attn_mask_type=block_causal)
  elif [ "$variant" = +bf16grads ]; then  # the same job, bf16 activation gradients
    variant_args=(--training.activation_grad_dtype=bfloat16)
  elif [ -n "$variant" ]; then  # the same job with other kernels
    cp "$config" "$out/$name.toml"
    case $variant in
      +mma)
        printf '\n[kernels]\nattention = { impl = "mma_sync", modules = "*" }\n' >>"$out/$name.toml"
        [ "$m" = MoE ] && printf 'moe_experts = { impl = "mma_sync", modules = "*" }\n' >>"$out/$name.toml" ;;
      +wide)
        [ "$m" = MoE ] || { echo "gpu_models: +wide is a variant of the MoE job only" >&2; exit 2; }
        printf '\n[kernels]\nmoe_experts = { impl = "mma_sync_wide", modules = "*" }\n' >>"$out/$name.toml" ;;
      +cudnn)
        printf '\n[kernels]\nattention = { impl = "cudnn", modules = "*" }\n' >>"$out/$name.toml"
        [ "$m" = MoE ] && printf 'moe_experts = { impl = "cudnn", modules = "*" }\n' >>"$out/$name.toml" ;;
      +wmma)
        printf '\n[kernels]\nattention = { impl = "default", modules = "*" }\n' >>"$out/$name.toml"
        [ "$m" = MoE ] && printf 'moe_experts = { impl = "default", modules = "*" }\n' >>"$out/$name.toml" ;;
      *) echo "gpu_models: unknown variant $variant in job $name (+mma, +wide, +cudnn, +wmma, +bf16grads or +docs)" >&2; exit 2 ;;
    esac
    config=$out/$name.toml
  fi
  echo "=== titan $name: --config $config $(job_args "$m") ${variant_args[*]}"
  # shellcheck disable=SC2046
  # --foreground: the job stays in this script's process group, so a limit on the script reaches it
  # too; -k: titan train stops only at a step boundary on SIGTERM, which a hung kernel never reaches.
  timeout --foreground -k 10 "${GPU_MODELS_JOB_LIMIT:-600}" "$titan" train --config "$config" $(job_args "$m") --training.seq_len=2048 --training.steps="$steps" \
    --lr_scheduler.warmup_steps=1 --activation_checkpoint.mode="$ac" --job.device=cuda \
    --checkpoint.enable=false --checkpoint.last_save_in_hf=false --validation.enable=false \
    --metrics.log_freq=1 --metrics.enable_tensorboard=false --job.dump_folder="$dump" \
    --profiling.enable_profiling=true --profiling.profile_freq="$profile_step" "${variant_args[@]}" >"$out/$name.log" 2>&1
  rc=$?
  tail -n 5 "$out/$name.log"
  # Where the profiled step's time went, op by op (the trace is under $dump/profile_traces).
  sed -n '/^profile of step/,/^  total/p' "$out/$name.log"
  if [ $rc -ne 0 ]; then
    failed=1
    rows+=("$(printf '%-8s FAILED (exit %d): %s' "$name" "$rc" "$(grep -m1 -i 'error' "$out/$name.log" | cut -c1-150)")")
    echo "row: ${rows[-1]}"
    continue
  fi
  read -r peer_tps peer_gib < <(peer_default "$m")
  if [ -n "${PEER_JSON:-}" ] && [ -f "$PEER_JSON" ]; then
    read -r peer_tps peer_gib < <(python3 - "$PEER_JSON" "$(peer_name "$m")" "$peer_tps" "$peer_gib" <<'EOF'
import json, sys
runs = {r.get("name"): r for r in json.load(open(sys.argv[1])).get("runs", [])}
r = runs.get(sys.argv[2], {})
print(r.get("tokens_per_s", sys.argv[3]), r.get("peak_mem_gib", sys.argv[4]))
EOF
)
  fi
  read -r floor_tps floor_gib < <(floor "$m")
  rows+=("$(python3 - "$dump/metrics.jsonl" "$name" "$peer_tps" "$peer_gib" "$floor_tps" "$floor_gib" \
              "${GPU_MODELS_GEMM_TFLOPS:-0}" "$out/$name.log" <<'EOF'
import json, re, sys
path, name, peer_tps, peer_gib, floor_tps, floor_gib, gemm, log = sys.argv[1:]
peer_tps, peer_gib, floor_tps, floor_gib, gemm = map(float, (peer_tps, peer_gib, floor_tps, floor_gib, gemm))
rec = [json.loads(l) for l in open(path) if l.strip()]
first = rec[0]
# From the start of the training run (config checks, CUDA start-up, model, init, data) to the end of
# the first step: the run's seconds (the summary line) less the later steps'. An upper bound: the
# profiled step's trace is written outside its step time.
total = re.findall(r"^summary: .*, ([0-9.]+) s", open(log).read(), re.M)
to_first = float(total[-1]) - sum(r["step_seconds"] for r in rec[1:]) if total else float("nan")
warm = 3  # as the peer: the first three steps are warm-up
sustained = sorted(rec[warm:] if len(rec) > warm else rec[1:], key=lambda r: r["step_seconds"])
med = sustained[len(sustained) // 2]
tps, tflops = med["tps"], med["tflops"]
gib = max(r["memory_gib"] for r in rec)
ok = tps >= floor_tps and (floor_gib == 0 or gib <= floor_gib)
mfu_gemm = f"{100 * tflops / gemm:5.1f}%" if gemm > 0 else "    -"
print(f"{name:<8} {to_first:6.1f}s {first['step_seconds']:6.2f}s {med['step_seconds']:7.3f}s {tps / 1e3:7.1f}k {tflops:6.0f} "
      f"{100 * tflops / 989:5.1f}% {mfu_gemm} {gib:6.1f} {peer_tps / 1e3:6.1f}k/{peer_gib:4.1f} "
      f"{tps / peer_tps:5.2f}x  >={floor_tps / 1e3:.1f}k{f' <={floor_gib:.0f}GiB' if floor_gib else ''} "
      f"{'PASS' if ok else 'MISS'}  loss {first['loss']:.3f} -> {rec[-1]['loss']:.3f}")
EOF
)")
  echo "row: ${rows[-1]}"  # each row as soon as it exists: a run cut short still shows the jobs it did
done

echo
echo "--- titan on the GPU vs transformers + torch.compile (${PEER_JSON:-peer figures of 2026-11-29}); AC=$ac, $steps steps"
echo "model    to 1st  first  median     tok/s TFLOPs  MFU989 MFUgemm  GiB  peer tok/s/GiB ratio floor"
printf '%s\n' "${rows[@]}"
exit $failed
