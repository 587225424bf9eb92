#!/usr/bin/env bash
# torchtitan's iteration time, W=2 FSDP2 on CPU: torchrun's wall time per step (the truth) against the pipeline's
# predicted iteration time (prism run up to the summary: pinned baseline, capture, graph, slices, calibrate),
# interleaved: torchrun, prism run, torchrun, prism run, ..., torchrun (ROUNDS prism runs, ROUNDS+1 torchruns).
# torchtitan's options and installation: scripts/frameworks/torchtitan_cpu.sh (6 steps here: iterations 1..5 timed).
# Raw results (small) go to docs/results/frameworks/timing_w2/; the table: 
#   .venv/bin/python scripts/frameworks/torchtitan_timing_table.py docs/results/frameworks/timing_w2
# Usage: scripts/frameworks/torchtitan_timing.sh TOKENIZER_DIR WORK_DIR [ROUNDS]
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); ROUNDS=${3:-2}
REPO=$(cd "$(dirname "$0")/../.." && pwd); PY=$REPO/.venv/bin/python; OUT=$REPO/docs/results/frameworks/timing_w2
mkdir -p "$WORK" "$OUT"; rm -f "$OUT"/*
export HF_DATASETS_OFFLINE=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
ARGS=(--module llama3 --config llama3_debugmodel --training.steps 6 --training.seq_len 128
      --training.local_batch_size 2 --dataloader.dataset_path "$WORK/data" --hf_assets_path "$TOKENIZER"
      --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
      --debug.seed 42 --dump_folder "$WORK/dump")
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)'), $(getconf _NPROCESSORS_ONLN) cores"
  echo "# torchrun --nproc-per-node 2 examples/torchtitan/cpu_train.py ${ARGS[*]}"; } > "$OUT/runs.txt"
stamp() { echo "$1: $2 exit $3, wall $4 s, load before $5, after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/runs.txt"; }
truth() {  # i: one torchrun (plain: what a user runs; torchrun sets OMP_NUM_THREADS=1 for 2 ranks)
  local l0; l0=$(cut -d' ' -f1-3 /proc/loadavg); local t0=$(date +%s)
  (cd "$WORK" && "$REPO/.venv/bin/torchrun" --nproc-per-node 2 "$REPO/examples/torchtitan/cpu_train.py" "${ARGS[@]}") \
    > "$WORK/torchrun_$1.log" 2>&1; local rc=$?
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
  (cd "$WORK" && "$REPO/.venv/bin/prism" run "$J/summary.txt" "$J/baseline/summary.txt" --configfile "$WORK/job_$1.yaml") \
    > "$WORK/prism_$1.log" 2>&1; local rc=$?
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
