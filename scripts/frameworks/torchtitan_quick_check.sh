#!/usr/bin/env bash
# A quick check that torchtitan still runs through prism after a runtime change: the llama3 debug model, W=2
# FSDP2 with torchtitan's default selective activation checkpointing, 2 steps: torchrun vs capture P=2, the
# graph's iteration count, and the emulation of sandbox rank 1 (the same install and options as
# scripts/frameworks/torchtitan_cpu.sh, which this shortens).
# Usage: scripts/frameworks/torchtitan_quick_check.sh TOKENIZER_DIR WORK_DIR
#   (log: docs/results/frameworks/torchtitan_quick_check.txt)
set -u
TOKENIZER=$(realpath "$1"); W=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
L=$REPO/docs/results/frameworks/torchtitan_quick_check.txt
rm -rf "$W"; mkdir -p "$W"; cd "$W" || exit 1
export HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
"$REPO/.venv/bin/python" "$REPO/examples/torchtitan/make_data.py" "$W/data"
TT=("$REPO/examples/torchtitan/cpu_train.py" --module llama3 --config llama3_debugmodel
    --training.steps 2 --training.seq_len 128 --training.local_batch_size 2
    --dataloader.dataset_path "$W/data" --hf_assets_path "$TOKENIZER"
    --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
    --debug.seed 42 --dump_folder "$W/dump")
echo "# $(date -u +%FT%TZ) torchtitan 0.3.0 W=2 FSDP2 (default SAC), 2 steps, prism at $(git -C "$REPO" rev-parse --short HEAD)" > "$L"
echo "# ${TT[*]#$REPO/}" >> "$L"
run() {  # name, command...: exit code, wall time, torchtitan's loss lines
    local n=$1; shift; local t0=$(date +%s)
    "$@" > "$W/$n.log" 2>&1; local rc=$?
    echo "== $n: exit $rc, wall $(( $(date +%s) - t0 )) s" >> "$L"
    sed 's/\x1b\[[0-9;]*m//g' "$W/$n.log" | grep -o "step: *[0-9]* *loss: *[0-9.]*" | sort -u >> "$L"
    [ $rc -eq 0 ] || grep "^\[prism\]" "$W/$n.log" | tail -3 >> "$L"
}
run torchrun "$REPO/.venv/bin/torchrun" --nproc-per-node 2 "${TT[@]}"
run capture_p2 "$REPO/.venv/bin/prism" launch --nproc 2 --mode capture --devices 2 --out "$W/job/capture" "${TT[@]}"
"$REPO/.venv/bin/prism" graph --job "$W/job" --raw "$W/job/capture/raw" --out "$W/job/graph" > /dev/null 2>&1
"$REPO/.venv/bin/prism" sql --job "$W/job" "SELECT rank, iterations, iteration_rule FROM ranks ORDER BY rank" 2>&1 \
    | grep -vE 'leaked|nanobind|skipped remainder|refleaks' >> "$L"
run emulate "$REPO/.venv/bin/prism" launch --nproc 2 --mode emulate --capture "$W/job/capture" --sandbox 1 \
    --out "$W/job/emu" "${TT[@]}"
echo "# done $(date -u +%FT%TZ)" >> "$L"
