#!/usr/bin/env bash
# The whole pipeline (prism run: baseline, capture, graph, slices, calibrate, emulate, summary, report) on
# DeepSpeed's ZeRO-2 engine, W=2 on CPU (examples/deepspeed/train.py, 6 steps of 2 microbatches), in the
# framework venv of scripts/frameworks/deepspeed_cpu.sh (run that first: it makes VENV). The predicted
# iteration time against the pinned baseline's, one run each (the box is shared: no spread measured).
# Usage: scripts/frameworks/deepspeed_pipeline.sh VENV WORK_DIR [TAG]
#   (log: docs/results/frameworks/deepspeed_pipeline_w2.txt, or deepspeed_pipeline_w2_TAG.txt: one log per run)
set -u
VENV=$(realpath -m "$1"); WORK=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOG=$REPO/docs/results/frameworks/deepspeed_pipeline_w2${3:+_$3}.txt; PY=$VENV/bin/python
[ -x "$PY" ] || { echo "no $PY: run scripts/frameworks/deepspeed_cpu.sh VENV WORK first" >&2; exit 2; }
rm -rf "$WORK"; mkdir -p "$WORK"
export OMP_NUM_THREADS=1
cat > "$WORK/job.yaml" <<YAML
job: deepspeed-zero2-w2
nproc: 2
results: $WORK/results
workload:
  script: $REPO/examples/deepspeed/train.py
  args: [--engine, zero, --zero-stage, "2", --steps, "6", --accum, "2"]
baseline: {run: always, pin: true}
capture: {devices: 2}
emulate: {sandbox: "1", devices: 1}
YAML
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__)' 2>/dev/null | tail -1)"
  echo "# $(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $PY -m prism.cli run --configfile $WORK/job.yaml"; cat "$WORK/job.yaml"; } > "$LOG"
t0=$(date +%s); (cd "$WORK" && "$PY" -m prism.cli run --configfile "$WORK/job.yaml") > "$WORK/run.log" 2>&1
rc=$?; echo "== prism run: exit $rc, wall $(( $(date +%s) - t0 )) s" >> "$LOG"
[ $rc -eq 0 ] || grep -vE 'leaked|nanobind|skipped remainder|refleaks' "$WORK/run.log" | tail -30 >> "$LOG"
J=$WORK/results/deepspeed-zero2-w2
for f in "$J/summary.txt" "$J/baseline/summary.txt"; do [ -f "$f" ] && { echo "== $f"; cat "$f"; } >> "$LOG"; done
"$PY" -m prism.cli sql --job "$J" "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks" 2>&1 \
    | grep -vE 'leaked|nanobind|skipped remainder|refleaks' >> "$LOG"
for stage in baseline_run capture slice_run_0 emulate; do  # each stage's losses, as the ranks printed them
    l=$J/logs/$stage.log
    [ -f "$l" ] && { echo "== losses in $l"; grep -oE 'step [0-9]+ rank [0-9]+ loss \S+' "$l" | sort; } >> "$LOG"
done
echo "# done $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG"
exit $rc
