#!/usr/bin/env bash
# The GPU tests and the GPU overhead table on a CUDA host (docs/gpu.md). Writes logs under ${OUT:-.}.
# Usage: tests/gpu/run_device.sh [pytest args...]
set -u
OUT=${OUT:-.}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
  command -v nvcc ninja; } 2>&1 | tee "$OUT/env.txt"
timeout "${PYTEST_S:-300}" python3 -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest.log"
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_S:-150}" python3 -m prism.cli bench overhead --device cuda $BENCH 2>&1 | tee "$OUT/overhead.txt"
fi
