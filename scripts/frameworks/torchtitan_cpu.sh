#!/usr/bin/env bash
# torchtitan's llama3 debug model on CPU (gloo): torchrun vs prism launch --mode real vs capture (P=2, P=1), then
# graph (iterations and rules per rank), summary and emulation of one sandbox rank; each run's losses compared
# exactly (the wrapper's hex-float line) with torchrun's, the sandbox's with the capture's.
# torchtitan is NOT a prism dependency: it is installed into this checkout's .venv only:
#   .venv/bin/pip install torchtitan==0.3.0 "datasets>=3.6.0,<4.8.0" spmd_types==0.2.3 einops pillow safetensors \
#       tensorboard tokenizers torch_checkpointing torchdata tyro wandb triton -c <(echo torch==2.13.0)
# (torchtitan 0.3.0 imports triton unconditionally; triton 3.9.0 imports on a CPU-only box.)
# Its tokenizer comes from torchtitan's repository (tests/assets/tokenizer: TOKENIZER below); the corpus
# from examples/torchtitan/make_data.py (the wheel ships no assets; c4_test's data.json is an LFS file).
# Usage: [VENV=DIR] scripts/frameworks/torchtitan_cpu.sh TOKENIZER_DIR WORK_DIR [LAYOUT] [STEPS]
#   VENV    the virtual environment with torchtitan (default: this checkout's .venv); this checkout's prism
#           runs in any case (PYTHONPATH)
#   LAYOUT  w2 (default): W=2 FSDP2                      log docs/results/frameworks/torchtitan_cpu_w2.txt
#           w4tp:         W=4 FSDP2 2 x TP 2              log .../torchtitan_cpu_w4_tp.txt
#           w4pp:         W=4 PP 2 (1F1B) x FSDP2 2       log .../torchtitan_cpu_w4_pp.txt
#   STEPS   training steps (default 4)
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); LAYOUT=${3:-w2}; STEPS=${4:-4}
REPO=$(cd "$(dirname "$0")/../.." && pwd); LOGS=$REPO/docs/results/frameworks; VENV=$(realpath "${VENV:-$REPO/.venv}")
PY=$VENV/bin/python; export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
case $LAYOUT in
  w2)   NPROC=2; SANDBOX=1; EXTRA=(); LOG=$LOGS/torchtitan_cpu_w2.txt ;;
  w4tp) NPROC=4; SANDBOX=1; EXTRA=(--parallelism.tensor_parallel_degree 2); LOG=$LOGS/torchtitan_cpu_w4_tp.txt ;;
  w4pp) NPROC=4; SANDBOX=3; EXTRA=(--parallelism.pipeline_parallel_degree 2 --training.disable_cuda_graphs); LOG=$LOGS/torchtitan_cpu_w4_pp.txt ;;
  *) echo "torchtitan_cpu.sh: unknown layout '$LAYOUT' (w2, w4tp or w4pp)" >&2; exit 2 ;;
esac
mkdir -p "$WORK" "$LOGS"
export HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
TT=("$REPO/examples/torchtitan/cpu_train.py" --module llama3 --config llama3_debugmodel
    --training.steps "$STEPS" --training.seq_len 128 --training.local_batch_size 2
    --dataloader.dataset_path "$WORK/data" --hf_assets_path "$TOKENIZER"
    --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
    --debug.seed 42 --dump_folder "$WORK/dump" "${EXTRA[@]}")
{ echo "# $(date -u +%FT%TZ) layout $LAYOUT, W=$NPROC, $STEPS steps; $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)'); load $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"
  echo "# ${TT[*]}"; } > "$LOG"
run() {  # name, command...: its log, exit code, wall time, losses, per-step wall time
  local name=$1; shift; local t0=$(date +%s.%N)
  (cd "$WORK" && "$@") > "$WORK/$name.log" 2>&1; local rc=$?
  local t1=$(date +%s.%N)
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -o "\[cpu_train\] rank [0-9]* step [0-9]* loss [-0-9a-fx.p+]*" \
    | sed 's/^\[cpu_train\] //' | sort -u > "$WORK/$name.loss"
  { echo "== $name: exit $rc, wall $(echo "$t1 - $t0" | bc) s, load $(cut -d' ' -f1-3 /proc/loadavg): $*"
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -o "step: *[0-9]* *loss: *[-0-9.]*" | sort -u
    # per-step wall time of rank 0 (torchtitan's own log timestamps of consecutive step lines)
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep "step: " | awk '!seen[$10]++' | \
      awk '{split($3, t, "[:,]"); s = t[1]*3600 + t[2]*60 + t[3] + t[4]/1000; if (n++) printf "step wall %.2f s\n", s - p; p = s}' \
      | paste -sd' ' | sed 's/^/  /'
    [ $rc -eq 0 ] || tail -5 "$WORK/$name.log"; } >> "$LOG"
}
same() {  # name, reference: are name's exact losses (rank, step, hex) all among the reference's?
  local n; n=$(wc -l < "$WORK/$1.loss")
  if [ "$n" -gt 0 ] && [ -z "$(comm -23 "$WORK/$1.loss" "$WORK/$2.loss")" ]; then
    echo "   exact losses of $1: $n (rank, step) lines, all equal to $2's" >> "$LOG"
  else
    { echo "   exact losses of $1: $n lines, NOT all equal to $2's:"; comm -3 "$WORK/$1.loss" "$WORK/$2.loss"; } >> "$LOG"
  fi
}
P=("$VENV/bin/prism")
run torchrun "$VENV/bin/torchrun" --nproc-per-node "$NPROC" "${TT[@]}"
cat "$WORK/torchrun.loss" | sed 's/^/   /' >> "$LOG"
run real "${P[@]}" launch --nproc "$NPROC" --mode real --out "$WORK/job_real" --force "${TT[@]}"; same real torchrun
run capture_p2 "${P[@]}" launch --nproc "$NPROC" --mode capture --devices 2 --out "$WORK/job/capture" --force "${TT[@]}"
same capture_p2 torchrun
run graph "${P[@]}" graph --job "$WORK/job" --raw "$WORK/job/capture/raw" --out "$WORK/job/graph"
run ranks "${P[@]}" sql --job "$WORK/job" \
    "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks ORDER BY rank"
cat "$WORK/ranks.log" >> "$LOG"
run markers "${P[@]}" sql --job "$WORK/job" \
    "SELECT rank, op, count(*) AS n FROM events WHERE kind = 'marker' GROUP BY ALL ORDER BY ALL"
cat "$WORK/markers.log" >> "$LOG"
run summary "${P[@]}" summary --job "$WORK/job"
cat "$WORK/summary.log" >> "$LOG"
run emulate "${P[@]}" launch --nproc "$NPROC" --mode emulate --capture "$WORK/job/capture" --sandbox "$SANDBOX" \
    --out "$WORK/job/emu" --force "${TT[@]}"
same emulate capture_p2
run capture_p1 "${P[@]}" launch --nproc "$NPROC" --mode capture --devices 1 --out "$WORK/job_p1/capture" --force "${TT[@]}"
same capture_p1 torchrun
