#!/usr/bin/env bash
# Async TP under inductor on this CPU build (scripts/frameworks/async_tp_inductor_cpu.py): does the micro-pipeline
# pass fuse, and does the compiled step run, under torchrun, prism launch --mode real and capture (P=2), with the
# pass's NCCL test as torch has it and passed (--gate), and without enable_symm_mem_for_group (--no-enable). One run at a time; each run's rank lines, exit code, wall
# time and the box's load go to the log. Usage: scripts/frameworks/async_tp_inductor_cpu.sh [WORK_DIR]
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd); WORK=$(realpath -m "${1:-/tmp/async_tp_inductor}")
LOG=$REPO/docs/results/frameworks/async_tp_inductor_cpu.txt; PY=$REPO/.venv/bin/python; mkdir -p "$WORK"
SCRIPT=$REPO/scripts/frameworks/async_tp_inductor_cpu.py
export OMP_NUM_THREADS=1
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch; print("torch", torch.__version__)'), $(getconf _NPROCESSORS_ONLN) cores, g++ $(g++ -dumpversion)"
  echo "# scripts/frameworks/async_tp_inductor_cpu.sh: W=2, gloo, CPU tensors, inductor (C++ build per graph)"; } > "$LOG"
run() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s.%N) load=$(cut -d' ' -f1 /proc/loadavg)
  (cd "$REPO" && "$@") > "$WORK/$name.log" 2>&1; local rc=$?
  { printf "\n== %s: exit %s, %.0f s, load %s\n# %s\n" "$name" "$rc" "$(echo "$(date +%s.%N) - $t0" | bc)" "$load" "$*" \
      | sed "s#$REPO/##g"
    grep -h "^rank [0-9]*: \|^\[rank[0-9]*\]: [A-Za-z]*Error\|\[prism\]" "$WORK/$name.log" | sort -s -k2,2n | uniq; } >> "$LOG"
}
TR=("$REPO/.venv/bin/torchrun" --nproc-per-node 2 --master-port 29561 "$SCRIPT")
P=("$REPO/.venv/bin/prism" launch --nproc 2)
run torchrun "${TR[@]}"
run torchrun_gate "${TR[@]}" --gate
run real_gate "${P[@]}" --mode real --out "$WORK/real" --force "$SCRIPT" --gate
run capture "${P[@]}" --mode capture --devices 2 --out "$WORK/capture" --force "$SCRIPT"
run capture_gate "${P[@]}" --mode capture --devices 2 --out "$WORK/capture_gate" --force "$SCRIPT" --gate
run capture_gate_no_enable "${P[@]}" --mode capture --devices 2 --out "$WORK/capture_gate_no_enable" --force "$SCRIPT" \
    --gate --no-enable
echo "log: $LOG"
