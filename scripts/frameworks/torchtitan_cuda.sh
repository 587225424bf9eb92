#!/usr/bin/env bash
# torchtitan 0.2.2 (the release cut against torch 2.11's nightlies, 2026-02-20; 0.3.0 calls torch APIs newer
# than 2.13) on one H200, in one device call (issue 21, item 3's H200 half): the llama3 debug model
#   a. W=8 (FSDP2 4 x TP 2) whole on the one GPU, first: capture, graph, ranks, plan, every slice run, durations,
#      calibrate, emulated sandbox rank 1 (TP pair 0-1), then sandbox rank 2 (TP pair 2-3, the other FSDP group);
#      every slice's and sandbox's losses compared with the capture's, exactly;
#   b. W=1 under torchrun (truth) and `prism launch --mode real`: exact losses, peak device memory per rank;
#      W=1 at the W=4/8 layouts' global batch 8 (the tolerance reference of their captures);
#   c. W=4 (FSDP2): capture, graph, ranks, emulated sandbox 1, plan, slices, durations, calibrate;
#   d. W=2 under torchrun on the one GPU (NCCL refuses two ranks on one GPU: what it says);
#   e. the comparisons with W=1 at global batch 8 (tolerance only).
# W=8 comes first so that a call runs it whole even with a, b or c skipped or short of budget; the overhead
# bench has its own script (scripts/overhead_levels.sh): its rows here only ever ran past their caps.
# Each step is time-boxed (`timeout`, from what is left of BUDGET_S), a failed step does not stop the others,
# and the table ($OUT/results.tsv, also printed) is written at the end in any case.
# Carried: .whl/ (prism's wheels, xz-packed: polars, duckdb, jsonschema, ...) and .tt/ (.tt/whl: torchtitan 0.2.2
# and what it needs beyond the image; .tt/tokenizer: torchtitan's tests/assets/tokenizer from its repository).
# The corpus comes from examples/torchtitan/make_data.py (deterministic).
# Usage: scripts/frameworks/torchtitan_cuda.sh OUT [BUDGET_S]     (from the repository root)
#   DRY=1     only install, check the imports and print the commands
#   SKIP=REGEX  skip the steps whose names match (local checks)
#   DEVICE=cpu  the same steps on a CPU-only torch (gloo, CUDA_TRAIN_CPU=1; the local check), PY=python to use
#   STEPS=N   training steps (default 4); TTCUDA_WORK=DIR the scratch folder (default /tmp/ttcuda.PID)
set -u
OUT=$(realpath -m "${1:?usage: torchtitan_cuda.sh OUT [BUDGET_S]}"); BUDGET=${2:-520}
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO" || exit 2
DEVICE=${DEVICE:-cuda}; PY=${PY:-python3}; T0=$(date +%s)
mkdir -p "$OUT"; LOG=$OUT/torchtitan_cuda.log; TSV=$OUT/results.tsv; WORK=${TTCUDA_WORK:-/tmp/ttcuda.$$}  # not shared
rm -rf "$WORK"; mkdir -p "$WORK"
printf 'step\texit\twall_s\tlosses\tpeaks\tnote\n' > "$TSV"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_DATASETS_OFFLINE=1
exec > >(tee -a "$LOG") 2>&1
if [ "$DEVICE" = cuda ]; then
  . scripts/device_site.sh
  for pk in .whl .tt/whl; do
    [ -d "$pk" ] || { echo "torchtitan_cuda.sh: $pk missing (carry it)"; exit 2; }
    install_site "$pk" "$PY" || { echo "torchtitan_cuda.sh: installing $pk failed"; exit 2; }
  done
  export CUDA_VISIBLE_DEVICES=0 PRISM_DEVICE=cuda CUDA_TRAIN_GPUS=1  # install_site empties CUDA_VISIBLE_DEVICES
  ulimit -n "$(ulimit -Hn)"
  TORCHRUN=("$PY" -m torch.distributed.run)
else
  export CUDA_TRAIN_CPU=1 OMP_NUM_THREADS=1 PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  TORCHRUN=("$PY" -m torch.distributed.run)
fi
PRISM=("$PY" -m prism.cli)
echo "# $(date -u +%FT%TZ) torchtitan_cuda.sh DEVICE=$DEVICE BUDGET=$BUDGET DRY=${DRY:-0}"
"$PY" -c 'import torch, torchtitan, datasets, tyro, torchdata, polars, duckdb, jsonschema, prism.cli
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "torchtitan",
      torchtitan.__version__, "datasets", datasets.__version__, "polars", polars.__version__)' \
  || { echo "torchtitan_cuda.sh: an import failed (above)"; [ "$DEVICE" = cuda ] && nvidia-smi -L; exit 2; }
[ -f .tt/tokenizer/tokenizer.json ] || { echo "torchtitan_cuda.sh: .tt/tokenizer/tokenizer.json missing (carry .tt: torchtitan's tests/assets/tokenizer)"; exit 2; }
"$PY" examples/torchtitan/make_data.py "$WORK/data" || exit 2
if [ "$DEVICE" = cuda ] && [ -z "${DRY:-}" ]; then
  # the emulated sandbox's CUDA fold kernel, built now beside the first steps: the sandbox builds it before its
  # program runs (fold_cuda.build_before_run) and would spend the emulate step's cap on nvcc (session 13)
  export PRISM_CUDA_BUILD_DIR=$WORK/fold-build
  ( "$PY" -c 'import time; t = time.monotonic(); from prism.runtime.emulate import fold_cuda; fold_cuda.module()
print(f"fold kernel built in {time.monotonic() - t:.1f} s")' > "$WORK/fold_build.log" 2>&1 ) &
fi
TT=(examples/torchtitan/cuda_train.py --model.name llama3 --model.flavor debugmodel
    --model.hf_assets_path "$REPO/.tt/tokenizer" --training.steps "${STEPS:-4}" --training.seq_len 128
    --training.local_batch_size 2 --training.dataset c4_test --training.dataset_path "$WORK/data"
    --metrics.log_freq 1 --debug.seed 42 --job.dump_folder "$WORK/dump")
TT=("$REPO/${TT[0]}" "${TT[@]:1}")
TP2=(--parallelism.tensor_parallel_degree 2)

left() { echo $(( BUDGET - ($(date +%s) - T0) - 15 )); }  # 15 s kept for the table and the tar
run() {  # name, cap_s, command...: time-boxed; its log, losses, peaks, a row of the table
  local name=$1 cap=$2; shift 2; local t=$(left); [ "$t" -lt "$cap" ] && cap=$t
  echo "== $name (timeout ${cap}s): $*"
  if [ -n "${DRY:-}" ] || [ "$cap" -le 5 ] || { [ -n "${SKIP:-}" ] && [[ $name =~ $SKIP ]]; }; then
    printf '%s\t%s\t0\t\t\t%s\n' "$name" skip "$([ "$cap" -le 5 ] && echo 'no budget left' || echo 'dry or SKIP')" >> "$TSV"
    return 0
  fi
  local t0=$(date +%s.%N); timeout -k 5 "$cap" "$@" > "$WORK/$name.log" 2>&1; local rc=$?; local t1=$(date +%s.%N)
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -o "\[cuda_train\] rank [0-9]* step [0-9]* loss [-0-9a-fx.p+]*" \
    | sed 's/^\[cuda_train\] //' | sort -u > "$WORK/$name.loss"
  grep -o "\[cuda_train\] rank [0-9]* peak allocated [-0-9]* reserved [-0-9]*" "$WORK/$name.log" \
    | sed 's/^\[cuda_train\] //' | sort -u > "$WORK/$name.peak"
  local note=""; [ "$rc" -eq 124 ] && note="timed out"
  [ "$rc" -ne 0 ] && [ -z "$note" ] && note=$(grep -E "Error|error:|refuse" "$WORK/$name.log" | grep -v "lspci" | tail -1 | cut -c1-200 | tr '\t' ' ')
  printf '%s\t%s\t%.1f\t%s\t%s\t%s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$(awk '{print $2 "/" $4 "=" $6}' "$WORK/$name.loss" | paste -sd' ')" \
    "$(awk '{print $2 ":" $5 "/" $7}' "$WORK/$name.peak" | paste -sd' ')" "$note" >> "$TSV"
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -E "step: |cuda_train|iteration|Error" | grep -v lspci | tail -40
  [ "$rc" -eq 0 ] || tail -15 "$WORK/$name.log"
  return 0
}
same() {  # name, reference: are name's exact (rank, step, loss) lines all among the reference's (by step)?
  local a=$WORK/$1.loss b=$WORK/$2.loss
  [ -s "$a" ] && [ -s "$b" ] || { echo "   $1 vs $2: no losses to compare"; printf 'same:%s=%s\t-\t0\t\t\tno losses\n' "$1" "$2" >> "$TSV"; return; }
  # compared by step: every rank of a data-parallel job logs the global average loss
  local d; d=$(comm -3 <(awk '{print $4, $6}' "$a" | sort -u) <(awk '{print $4, $6}' "$b" | sort -u))
  local v=equal; [ -n "$d" ] && v="DIFFER: $(echo $d)"
  echo "   losses of $1 vs $2 (by step): $v"; printf 'same:%s=%s\t-\t0\t\t\t%s\n' "$1" "$2" "$v" >> "$TSV"
}
near() {  # name, reference: the largest relative difference of the step losses (rank 0's)
  local v; v=$("$PY" - "$WORK/$1.loss" "$WORK/$2.loss" <<'PYEOF'
import sys
def steps(p):
    try:
        return {int(s): float.fromhex(x) for r, s, x in (l.split()[1:6:2] for l in open(p)) if r == "0"}
    except OSError:
        return {}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
common = sorted(set(a) & set(b))
print(f"{len(common)} steps, max rel diff {max(abs(a[s] - b[s]) / abs(b[s]) for s in common):.3g}" if common else "no common steps")
PYEOF
)
  echo "   losses of $1 vs $2: $v"; printf 'near:%s=%s\t-\t0\t\t\t%s\n' "$1" "$2" "$v" >> "$TSV"
}

slices() {  # layout (w4, w8_tp), job: the plan on 2 devices, every slice run (its losses vs the capture's),
            # the durations and the calibration
  local L=$1 J=$2 k
  run "plan_$L" 30 "$PY" -m prism.slices.plan --job "$J" --devices 2
  run "groups_$L" 20 "$PY" scripts/frameworks/slice_groups.py "$J"  # the all-slice groups (NCCL or gloo)
  for k in $("$PY" -c 'import sys, pyarrow.parquet as pq; print(*sorted(set(pq.read_table(sys.argv[1])["slice"].to_pylist())))' \
             "$J/slices/plan.parquet" 2>/dev/null); do
    run "slice_${L}_$k" 90 "$PY" -m prism.slices.run --job "$J" --slice "$k"
    same "slice_${L}_$k" "capture_$L"
  done
  run "durations_$L" 30 "$PY" -m prism.calibrate.from_slices --job "$J"
  run "calibrate_$L" 30 "$PY" -m prism.calibrate --job "$J" --durations "$J/slices/durations.parquet" \
      --transfers "$J/slices/transfers.parquet" --out "$J/calibrated"
}

# a. W=8 FSDP2 4 x TP 2 on the one GPU, whole; first the rule its slices need (a TP pair on one GPU: gloo, not NCCL)
[ "$DEVICE" = cuda ] && run pair_one_gpu 60 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_slice_one_device_cuda.py
run capture_w8_tp 130 "${PRISM[@]}" launch --nproc 8 --mode capture --devices 2 --out "$WORK/w8/capture" --force "${TT[@]}" "${TP2[@]}"
run graph_w8_tp 40 "${PRISM[@]}" graph --job "$WORK/w8" --raw "$WORK/w8/capture/raw" --out "$WORK/w8/graph"
run ranks_w8_tp 20 "${PRISM[@]}" sql --job "$WORK/w8" "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks ORDER BY rank"
slices w8_tp "$WORK/w8"
run emulate_w8_tp 150 "${PRISM[@]}" launch --nproc 8 --mode emulate --capture "$WORK/w8/capture" --sandbox 1 \
    --out "$WORK/w8/emu" --force "${TT[@]}" "${TP2[@]}"
same emulate_w8_tp capture_w8_tp
run emulate_w8_tp_s2 150 "${PRISM[@]}" launch --nproc 8 --mode emulate --capture "$WORK/w8/capture" --sandbox 2 \
    --out "$WORK/w8/emu_s2" --force "${TT[@]}" "${TP2[@]}"
same emulate_w8_tp_s2 capture_w8_tp
# b. W=1: truth and real mode; the W=4/8 layouts' global batch (8) at W=1: their truth as near as one GPU allows
# (the same tokens, another reduction order: compared within a tolerance, not exactly; e. below)
run torchrun_w1 100 "${TORCHRUN[@]}" --nproc-per-node 1 "${TT[@]}"
run real_w1 100 "${PRISM[@]}" launch --nproc 1 --mode real --out "$WORK/real_w1" --force "${TT[@]}"
same real_w1 torchrun_w1
run torchrun_w1_gb8 100 "${TORCHRUN[@]}" --nproc-per-node 1 "${TT[@]}" --training.local_batch_size 8
# c. W=4 FSDP2 on the one GPU
run capture_w4 120 "${PRISM[@]}" launch --nproc 4 --mode capture --devices 2 --out "$WORK/w4/capture" --force "${TT[@]}"
run graph_w4 40 "${PRISM[@]}" graph --job "$WORK/w4" --raw "$WORK/w4/capture/raw" --out "$WORK/w4/graph"
run ranks_w4 20 "${PRISM[@]}" sql --job "$WORK/w4" "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks ORDER BY rank"
run emulate_w4 100 "${PRISM[@]}" launch --nproc 4 --mode emulate --capture "$WORK/w4/capture" --sandbox 1 \
    --out "$WORK/w4/emu" --force "${TT[@]}"
same emulate_w4 capture_w4
slices w4 "$WORK/w4"
# d. W=2 on one GPU under torchrun (NCCL)
run torchrun_w2 45 "${TORCHRUN[@]}" --nproc-per-node 2 "${TT[@]}"
# e. the captures against W=1 at global batch 8
near capture_w8_tp torchrun_w1_gb8
near capture_w4 torchrun_w1_gb8

echo "== table ($TSV)"; column -t -s $'\t' "$TSV" 2>/dev/null || cat "$TSV"
for f in ranks_w8_tp groups_w8_tp calibrate_w8_tp ranks_w4 groups_w4 calibrate_w4; do
  [ -f "$WORK/$f.log" ] && { echo "== $f"; tail -25 "$WORK/$f.log"; }
done
[ -f "$WORK/fold_build.log" ] && { echo "== fold_build"; tail -3 "$WORK/fold_build.log"; }
tar -czf "$OUT/logs.tgz" -C "$WORK" $(cd "$WORK" && ls *.log *.loss *.peak 2>/dev/null) 2>/dev/null
echo "# done in $(( $(date +%s) - T0 )) s"
