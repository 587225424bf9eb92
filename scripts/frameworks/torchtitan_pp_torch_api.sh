#!/usr/bin/env bash
# Why torchtitan 0.3.0's pipeline parallelism needs examples/torchtitan/cpu_train.py's step adapter on torch 2.13.0:
# W=4 PP 2 x FSDP2 2 with the adapter off (CPU_TRAIN_NO_PP_ADAPTER=1), under torchrun, prism launch --mode real and
# capture: the same torchtitan/torch error in all three (not prism's, not CPU's). Also the first error on the way,
# without --training.disable_cuda_graphs (torchtitan's config check, any device). Same options and installation as
# scripts/frameworks/torchtitan_cpu.sh (layout w4pp). Usage: scripts/frameworks/torchtitan_pp_torch_api.sh TOKENIZER_DIR WORK_DIR
set -u
TOKENIZER=$(realpath "$1"); WORK=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOG=$REPO/docs/results/frameworks/torchtitan_cpu_w4_pp_torch_api.txt; PY=$REPO/.venv/bin/python; mkdir -p "$WORK"
export HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
$PY "$REPO/examples/torchtitan/make_data.py" "$WORK/data"
TT=("$REPO/examples/torchtitan/cpu_train.py" --module llama3 --config llama3_debugmodel --training.steps 2
    --training.seq_len 128 --training.local_batch_size 2 --dataloader.dataset_path "$WORK/data"
    --hf_assets_path "$TOKENIZER" --checkpoint.no-enable --validator.no-enable --parallelism.spmd_backend partial_dtensor
    --debug.seed 42 --dump_folder "$WORK/dump" --parallelism.pipeline_parallel_degree 2)
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, torchtitan; print("torch", torch.__version__, "torchtitan", torchtitan.__version__)')"
  echo "# ${TT[*]} [--training.disable_cuda_graphs]"; } > "$LOG"
run() {  # name, command...: exit code and the distinct error lines
  local name=$1; shift
  (cd "$WORK" && "$@") > "$WORK/$name.log" 2>&1; local rc=$?
  { echo "== $name: exit $rc: ${*:1:8} ..."
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" | grep -o "[A-Za-z]*Error: .*\|Error parsing Config: .*\|\[prism\].*" \
      | grep -v lspci | sort | uniq -c; } >> "$LOG"
}
P=("$REPO/.venv/bin/prism")
run torchrun_cuda_graphs "$REPO/.venv/bin/torchrun" --nproc-per-node 4 "${TT[@]}"
run real_cuda_graphs "${P[@]}" launch --nproc 4 --mode real --out "$WORK/job_real" --force "${TT[@]}"
export CPU_TRAIN_NO_PP_ADAPTER=1
run torchrun_no_adapter "$REPO/.venv/bin/torchrun" --nproc-per-node 4 "${TT[@]}" --training.disable_cuda_graphs
run real_no_adapter "${P[@]}" launch --nproc 4 --mode real --out "$WORK/job_real" --force "${TT[@]}" --training.disable_cuda_graphs
run capture_no_adapter "${P[@]}" launch --nproc 4 --mode capture --devices 2 --out "$WORK/job/capture" --force "${TT[@]}" \
    --training.disable_cuda_graphs
