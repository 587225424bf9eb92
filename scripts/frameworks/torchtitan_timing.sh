#!/usr/bin/env bash
# torchtitan's iteration time, W=2 FSDP2 on CPU: torchrun's wall time per step (the truth) against the pipeline's
# predicted iteration time (prism run up to the summary: pinned baseline, capture, graph, slices, calibrate),
# interleaved: torchrun, prism run, torchrun, prism run, ..., torchrun (ROUNDS prism runs, ROUNDS+1 torchruns).
# torchtitan's options and installation: scripts/frameworks/torchtitan_cpu.sh (6 steps here: iterations 1..5 timed).
# The truth (session 15): torchrun's ranks pinned one core each, one torch intra-op thread (the wrapper's
# CPU_TRAIN_PIN=1, by LOCAL_RANK: the layout of prism's pinned baseline and slice runs), on cores claimed the way
# prism's pinned runs claim theirs (prism.runtime.launch.cores: no other prism run pins to them meanwhile).
# TRUTH_PIN=0: plain torchrun, unpinned (session 11's truth: docs/results/frameworks/timing_w2/).
# Each run's box load is sampled every 2 s (load_NAME.txt: uptime, 1-minute load, runnable/all tasks).
# Raw results (small) go to OUT (default docs/results/frameworks/timing_w2_s15/); the table:
#   .venv/bin/python scripts/frameworks/torchtitan_timing_table.py OUT
# Usage: [TRUTH_PIN=0|1] [OUT=DIR] scripts/frameworks/torchtitan_timing.sh TOKENIZER_DIR WORK_DIR [ROUNDS]
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); ROUNDS=${3:-2}
REPO=$(cd "$(dirname "$0")/../.." && pwd); PY=$REPO/.venv/bin/python; TRUTH_PIN=${TRUTH_PIN:-1}
OUT=$(realpath -m "${OUT:-$REPO/docs/results/frameworks/timing_w2_s15}")
mkdir -p "$WORK" "$OUT"; rm -f "$OUT"/* 2> /dev/null  # its files (a folder inside, e.g. a control's, stays)
export HF_DATASETS_OFFLINE=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
ARGS=(--module llama3 --config llama3_debugmodel --training.steps 6 --training.seq_len 128
      --training.local_batch_size 2 --dataloader.dataset_path "$WORK/data" --hf_assets_path "$TOKENIZER"
      --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
      --debug.seed 42 --dump_folder "$WORK/dump")
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)'), $(getconf _NPROCESSORS_ONLN) cores"
  if [ "$TRUTH_PIN" = 1 ]; then echo "# truth: CPU_TRAIN_PIN=1 (each rank on one core by LOCAL_RANK, 1 torch thread), the cores claimed as prism's pinned runs claim theirs"
  else echo "# truth: plain torchrun, unpinned (TRUTH_PIN=0)"; fi
  echo "# torchrun --nproc-per-node 2 examples/torchtitan/cpu_train.py ${ARGS[*]}"; } > "$OUT/runs.txt"
"$PY" -m pip freeze 2> /dev/null | grep -iE "^(torch|torchtitan|datasets|tokenizers|spmd|torchdata|tyro|triton|numpy|fsspec|safetensors|einops|huggingface)" \
  > "$OUT/versions.txt"  # the packages the program's numbers depend on
stamp() { echo "$1: $2 exit $3, wall $4 s, load before $5, after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.txt"; }
SAMPLER=
sample() {  # name: the box's load every 2 s until `unsample` (uptime s, 1-minute load, runnable/all tasks)
  local f=$OUT/load_$1.txt; : > "$f"
  ( while :; do read -r up _ < /proc/uptime; read -r l1 _ _ rq _ < /proc/loadavg; echo "$up $l1 $rq" >> "$f"; sleep 2; done ) &
  SAMPLER=$!
}
unsample() { kill "$SAMPLER" 2> /dev/null; wait "$SAMPLER" 2> /dev/null; SAMPLER=; }
trap unsample EXIT
# the pinned truth: the cores claimed for the run (prism's claim: first free of the affinity, lowest first, as the
# baseline's), named to the wrapper in local-rank order
CLAIM='import os, subprocess, sys
from prism.runtime.launch import cores
claim = cores.CoreClaim(2, "torchtitan_timing.sh: torchrun pinned")
os.environ.update(CPU_TRAIN_PIN="1", CPU_TRAIN_PIN_CORES=",".join(map(str, claim.cores)))
sys.exit(subprocess.call(sys.argv[1:]))'
truth() {  # i: one torchrun (torchrun sets OMP_NUM_THREADS=1 for 2 ranks); pinned unless TRUTH_PIN=0
  local l0; l0=$(cut -d' ' -f1-3 /proc/loadavg); local t0=$(date +%s) pre=()
  [ "$TRUTH_PIN" = 1 ] && pre=("$PY" -c "$CLAIM")
  sample "torchrun_$1"
  (cd "$WORK" && "${pre[@]}" "$REPO/.venv/bin/torchrun" --nproc-per-node 2 "$REPO/examples/torchtitan/cpu_train.py" "${ARGS[@]}") \
    > "$WORK/torchrun_$1.log" 2>&1; local rc=$?
  unsample
  stamp "torchrun_$1" torchrun $rc $(( $(date +%s) - t0 )) "$l0"
  grep -o "\[cpu_train\] rank .*" "$WORK/torchrun_$1.log" > "$OUT/torchrun_$1.txt"
}
predict() {  # i: the pipeline up to the summary, a fresh results folder
  local R=$WORK/results_$1 J; J=$R/torchtitan-w2
  cat > "$WORK/job_$1.yaml" <<YAML
job: torchtitan-w2
nproc: 2
results: $R
workload:
  script: $REPO/examples/torchtitan/cpu_train.py
  args: [$(printf '"%s", ' "${ARGS[@]}" | sed 's/, $//')]
baseline: {run: always, pin: true}
capture: {devices: 2}
YAML
  local l0; l0=$(cut -d' ' -f1-3 /proc/loadavg); local t0=$(date +%s)
  sample "prism_$1"
  (cd "$WORK" && "$REPO/.venv/bin/prism" run "$J/summary.txt" "$J/baseline/summary.txt" --configfile "$WORK/job_$1.yaml") \
    > "$WORK/prism_$1.log" 2>&1; local rc=$?
  unsample
  stamp "prism_$1" "prism run" $rc $(( $(date +%s) - t0 )) "$l0"
  [ $rc -eq 0 ] || { tail -30 "$WORK/prism_$1.log" >> "$OUT/runs.txt"; return; }
  cp "$J/summary.txt" "$OUT/prism_$1_summary.txt"; cp "$J/baseline/summary.txt" "$OUT/prism_$1_baseline_summary.txt"
  cp "$J/calibrated/iterations.parquet" "$OUT/prism_$1_predicted_iterations.parquet"
  "$REPO/.venv/bin/prism" sql --job "$J/baseline" --csv \
    "SELECT rank, iteration, t_end_ns FROM events WHERE op = 'iteration_end' ORDER BY rank, iteration" \
    > "$OUT/prism_$1_baseline_ends.csv" 2>> "$OUT/runs.txt"
  # time by kind per rank and iteration: the prediction (calibrated timeline) and the baseline (its own clocks)
  "$REPO/.venv/bin/prism" sql --job "$J" --csv \
    "SELECT t.rank, e.iteration, e.kind, sum(t.end_ns - t.start_ns) AS span_ns, count(*) AS n FROM timeline t
     JOIN events e USING (event_id) GROUP BY ALL ORDER BY ALL" > "$OUT/prism_$1_predicted_kinds.csv" 2>> "$OUT/runs.txt"
  "$REPO/.venv/bin/prism" sql --job "$J/baseline" --csv \
    "SELECT rank, iteration, kind, sum(t_end_ns - t_start_ns) AS span_ns, sum(greatest(cpu_ns, 0)) AS cpu_ns, count(*) AS n
     FROM events GROUP BY ALL ORDER BY ALL" > "$OUT/prism_$1_baseline_kinds.csv" 2>> "$OUT/runs.txt"
  grep -o "\[cpu_train\] rank .*" "$J/logs/baseline_run.log" > "$OUT/prism_$1_baseline_lines.txt"
  # the same compute events on three clocks (the table's last part): baseline, capture, slice runs
  cp "$J/baseline/graph/events.parquet" "$OUT/prism_$1_baseline_events.parquet"
  cp "$J/graph/events.parquet" "$OUT/prism_$1_events.parquet"
  cp "$J/slices/durations.parquet" "$OUT/prism_$1_slice_durations.parquet"
}
for i in $(seq 1 "$ROUNDS"); do truth "$i"; predict "$i"; done
truth $((ROUNDS + 1))
$PY "$REPO/scripts/frameworks/torchtitan_timing_table.py" "$OUT" > "$OUT/table.txt"; cat "$OUT/table.txt"
