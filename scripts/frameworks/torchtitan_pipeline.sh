#!/usr/bin/env bash
# The whole pipeline (prism run: baseline, capture, graph, slices, calibrate, emulate, summary, report) on
# torchtitan's llama3 debug model, W=2 FSDP2 on CPU, through examples/torchtitan/cpu_train.py; the same
# torchtitan options and installation as scripts/frameworks/torchtitan_cpu.sh.
# Usage: scripts/frameworks/torchtitan_pipeline.sh TOKENIZER_DIR WORK_DIR   (log: docs/results/frameworks/)
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOG=$REPO/docs/results/frameworks/torchtitan_pipeline_w2.txt; PY=$REPO/.venv/bin/python; mkdir -p "$WORK"
export HF_DATASETS_OFFLINE=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
cat > "$WORK/job.yaml" <<YAML
job: torchtitan-w2
nproc: 2
results: $WORK/results
workload:
  script: $REPO/examples/torchtitan/cpu_train.py
  args: [--module, llama3, --config, llama3_debugmodel, --training.steps, "6", --training.seq_len, "128",
         --training.local_batch_size, "2", --dataloader.dataset_path, $WORK/data, --hf_assets_path, $TOKENIZER,
         --checkpoint.no-enable, --validator.no-enable, --parallelism.spmd_backend, partial_dtensor,
         --debug.seed, "42", --dump_folder, $WORK/dump]
baseline: {run: always, pin: true}
capture: {devices: 2}
emulate: {sandbox: "1", devices: 1}
YAML
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)')"
  echo "# prism run --configfile $WORK/job.yaml"; cat "$WORK/job.yaml"; } > "$LOG"
t0=$(date +%s); (cd "$WORK" && "$REPO/.venv/bin/prism" run --configfile "$WORK/job.yaml") > "$WORK/run.log" 2>&1
rc=$?; echo "== prism run: exit $rc, wall $(( $(date +%s) - t0 )) s" >> "$LOG"
[ $rc -eq 0 ] || tail -30 "$WORK/run.log" >> "$LOG"
J=$WORK/results/torchtitan-w2
for f in "$J/summary.txt" "$J/baseline/summary.txt"; do [ -f "$f" ] && { echo "== $f"; cat "$f"; } >> "$LOG"; done
"$REPO/.venv/bin/prism" sql --job "$J" "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks" >> "$LOG" 2>&1
for d in baseline capture emulation; do
  for l in "$J"/$d/logs/rank=*.log; do [ -f "$l" ] && { echo "== $l"; sed 's/\x1b\[[0-9;]*m//g' "$l" | grep -o "step: *[0-9]* *loss: *[0-9.]*" | sort -u; } >> "$LOG"; done
done
exit $rc
