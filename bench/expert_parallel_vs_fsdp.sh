#!/usr/bin/env bash
# Expert parallelism against FSDP on one host: the main job's MoE (configs/debugmodel.toml with
# model.flavor = debugmodel_moe) on RANKS ranks x 1 thread (default 2), FSDP (every expert gathered
# per layer) vs FSDP + EP 2 (each rank holds half of the experts, sharded over the RANKS / 2 ranks
# holding the same half; the tokens travel instead), the same global batch (RANKS x SEQ tokens).
# Per mode: sustained tokens/s over all ranks (warm-up excluded), the bytes rank 0 sent per step
# (metrics.jsonl comm_mib: gathers, reductions and, under EP, the all-to-alls), the share of the step
# inside communication calls, what rank 0 keeps of the weights, gradients and AdamW state (the
# start-up log's memory per rank) and its peak memory (the allocator's, metrics memory_gib).
# Communication goes through shared memory here; with more ranks than cores the ranks take turns.
#
#   [RANKS=4] bash bench/expert_parallel_vs_fsdp.sh [STEPS] [SEQ] [PRECISION]   # default 6 steps, 512, bfloat16
source "$(dirname "$0")/debugmodel_job.sh" "$@"
common+=(--model.flavor=debugmodel_moe)
RANKS=${RANKS:-2}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p'), $RANKS ranks, $STEPS steps of global batch $RANKS x $SEQ, $PREC, load $(cut -d' ' -f1 /proc/loadavg)"
for mode in fsdp ep; do
  extra=()
  [ "$mode" = ep ] && extra=(--parallelism.expert_parallel_degree=2)
  OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np "$RANKS" "$TITAN" train "${common[@]}" \
    "${extra[@]}" --training.local_batch_size=1 --job.dump_folder="$OUT/$mode" >"$OUT/$mode.log" 2>&1 ||
    { tail -5 "$OUT/$mode.log"; exit 1; }
done
python3 - "$OUT" "$RANKS" <<'PY'
import json, re, sys
out, ranks = sys.argv[1], int(sys.argv[2])
print(f"{'mode':10} {'tokens/s':>9} {'sent MiB':>9} {'comm s':>8} {'step s':>8} {'in comm':>8} {'kept MiB':>9} {'peak GiB':>9} {'final loss':>11}")
for mode, name in (("fsdp", f"FSDP {ranks}"), ("ep", f"FSDP+EP 2")):
    log = open(f"{out}/{mode}.log").read()
    tps = ranks * float(re.search(r"sustained ([0-9.]+) tokens/s", log).group(1))
    kept = sum(float(x) for x in re.search(
        r"parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, AdamW state ([0-9.]+) MiB", log).groups())
    rows = [json.loads(l) for l in open(f"{out}/{mode}/metrics.jsonl") if l.strip()]
    measured = [r for r in rows if not r["warmup"]] or rows
    mean = lambda k: sum(r[k] for r in measured) / len(measured)
    print(f"{name:10} {tps:9.0f} {mean('comm_mib'):9.1f} {mean('comm_seconds'):8.3f} {mean('step_seconds'):8.3f} "
          f"{100 * mean('comm_seconds') / mean('step_seconds'):7.1f}% {kept:9.1f} {max(r['memory_gib'] for r in rows):9.2f} "
          f"{rows[-1]['loss']:11.4f}")
PY
