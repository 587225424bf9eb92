#!/usr/bin/env bash
# torchtitan's llama3 debug model on CPU (gloo), W=2 FSDP2: torchrun vs prism launch --mode real vs capture
# (P=1, 2), then graph and emulation of one sandbox rank; the losses and prism's iteration counts side by side.
# torchtitan is NOT a prism dependency: it is installed into this checkout's .venv only:
#   .venv/bin/pip install torchtitan==0.3.0 "datasets>=3.6.0,<4.8.0" spmd_types==0.2.3 einops pillow safetensors \
#       tensorboard tokenizers torch_checkpointing torchdata tyro wandb triton -c <(echo torch==2.13.0)
# (torchtitan 0.3.0 imports triton unconditionally; triton 3.9.0 imports on a CPU-only box.)
# Its tokenizer comes from torchtitan's repository (tests/assets/tokenizer: TOKENIZER below); the corpus
# from examples/torchtitan/make_data.py (the wheel ships no assets; c4_test's data.json is an LFS file).
# Usage: scripts/frameworks/torchtitan_cpu.sh TOKENIZER_DIR WORK_DIR   (logs: docs/results/frameworks/)
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOGS=$REPO/docs/results/frameworks; PY=$REPO/.venv/bin/python; mkdir -p "$WORK" "$LOGS"
export HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
TT=("$REPO/examples/torchtitan/cpu_train.py" --module llama3 --config llama3_debugmodel
    --training.steps 4 --training.seq_len 128 --training.local_batch_size 2
    --dataloader.dataset_path "$WORK/data" --hf_assets_path "$TOKENIZER"
    --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
    --debug.seed 42 --dump_folder "$WORK/dump")
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)')"
  echo "# ${TT[*]}"; } > "$LOGS/torchtitan_cpu_w2.txt"
run() {  # name, command...: its log, exit code, wall time and step lines
  local name=$1; shift; local t0=$(date +%s.%N)
  (cd "$WORK" && "$@") > "$WORK/$name.log" 2>&1; local rc=$?
  local t1=$(date +%s.%N)
  { echo "== $name: exit $rc, wall $(echo "$t1 - $t0" | bc) s: $*"
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -o "step: *[0-9]* *loss: *[0-9.]*" | sort -u
    # per-step wall time of rank 0 (torchtitan's own log timestamps of consecutive step lines)
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep "step: " | awk '!seen[$10]++' | \
      awk '{split($3, t, "[:,]"); s = t[1]*3600 + t[2]*60 + t[3] + t[4]/1000; if (n++) printf "step wall %.2f s\n", s - p; p = s}' \
      | paste -sd' ' | sed 's/^/  /'
    [ $rc -eq 0 ] || tail -5 "$WORK/$name.log"; } >> "$LOGS/torchtitan_cpu_w2.txt"
}
run torchrun "$REPO/.venv/bin/torchrun" --nproc-per-node 2 "${TT[@]}"
run real "$REPO/.venv/bin/prism" launch --nproc 2 --mode real --out "$WORK/job_real" --force "${TT[@]}"
run capture_p2 "$REPO/.venv/bin/prism" launch --nproc 2 --mode capture --devices 2 --out "$WORK/job/capture" --force "${TT[@]}"
run graph "$REPO/.venv/bin/prism" graph --job "$WORK/job" --raw "$WORK/job/capture/raw" --out "$WORK/job/graph"
run ranks "$REPO/.venv/bin/prism" sql --job "$WORK/job" \
    "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks ORDER BY rank"
cat "$WORK/ranks.log" >> "$LOGS/torchtitan_cpu_w2.txt"
run markers "$REPO/.venv/bin/prism" sql --job "$WORK/job" \
    "SELECT rank, op, count(*) AS n FROM events WHERE kind = 'marker' GROUP BY ALL ORDER BY ALL"
cat "$WORK/markers.log" >> "$LOGS/torchtitan_cpu_w2.txt"
run summary "$PY" -m prism.summary --job "$WORK/job"
cat "$WORK/job/summary.txt" >> "$LOGS/torchtitan_cpu_w2.txt"
run emulate "$REPO/.venv/bin/prism" launch --nproc 2 --mode emulate --capture "$WORK/job/capture" --sandbox 1 \
    --out "$WORK/job/emu" --force "${TT[@]}"
run capture_p1 "$REPO/.venv/bin/prism" launch --nproc 2 --mode capture --devices 1 --out "$WORK/job_p1/capture" --force "${TT[@]}"
