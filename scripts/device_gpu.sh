#!/usr/bin/env bash
# Everything GPU of issue 9 in one device call on 1× H200 (docs/gpu.md, sessions 5-6), eight jobs at once:
#   A  pytest -m gpu on tests/gpu except the memory, swap, capture, emulate tests -> OUT/pytest.log
#   E  tests/gpu/test_emulate_cuda.py                                  -> OUT/emulate-pytest.log, emulate_memory-*.json
#   S  tests/gpu/test_swap.py                                          -> OUT/swap-pytest.log, OUT/swap.json
#   K  tests/gpu/test_capture_cuda.py                                  -> OUT/capture-pytest.log
#   B  tests/gpu/test_memory_oom.py (memory fidelity against 3 real runs + OOM) -> OUT/memory-pytest.log, OUT/memory_*.{json,md}
#   C  compute-sanitizer (memcheck) on tests/gpu/test_fold_cuda.py    -> OUT/sanitizer.log (if the host has it)
#   D  tests/gpu/host_scale.py: host memory and start-up, W=8/32/64   -> OUT/host_scale.{log,json}
#   L  tests/gpu/test_slices_cuda.py: capture -> graph -> plan -> slice runs on CUDA -> calibrate
#                                                                      -> OUT/slices-pytest.log, OUT/slices_cuda-*.json
# Usage: OUT=DIR [JOBS=AESKBCDL] [PKGS=DIR] scripts/device_gpu.sh [SECONDS per job, default 240] (JOBS: the letters
# to run). Job L needs polars and jsonschema, which the H200 image lacks: PKGS names a folder of wheels (*.whl)
# and xz-packed unpacked wheels (*.tar.xz), e.g. gpu_stage/s5fid/.pkgs (carried), installed into /tmp/site.
# The device tool returns at most 8 files: everything is written under a work folder, then packed as
# OUT/results.tgz (OUT/ names above are inside it).
set -uo pipefail
DEST=${OUT:-.}
OUT=$(mktemp -d /tmp/prism-gpu-XXXX)
T=${1:-240}
JOBS=${JOBS:-AESKBCDL}
on() { [[ $JOBS == *$1* ]]; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PRISM_CUDA_BUILD_DIR=/tmp/prism-fold-build PYTHONPATH=$PWD
if [ -n "${PKGS:-}" ]; then  # the analysis stages' packages (polars, jsonschema) for job L
  mkdir -p /tmp/site
  compgen -G "$PKGS/*.whl" > /dev/null && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site "$PKGS"/*.whl > "$OUT/pkgs.log" 2>&1
  for t in "$PKGS"/*.tar.xz; do [ -e "$t" ] && tar -xJf "$t" -C /tmp/site; done
  export PYTHONPATH=$PWD:/tmp/site
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; free -g | head -2
  python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
  command -v nvcc ninja compute-sanitizer; ls -d /usr/local/cuda*/bin 2>/dev/null
  python3 -c "import polars, jsonschema; print('polars', polars.__version__)"; } > "$OUT/env.txt" 2>&1
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
PY="python3 -m pytest -p no:cacheprovider -rs"

on A && ( timeout "$T" $PY --basetemp=/tmp/pt-a -m gpu tests/gpu -v --ignore=tests/gpu/test_memory_oom.py --ignore=tests/gpu/test_swap.py \
    --ignore=tests/gpu/test_capture_cuda.py --ignore=tests/gpu/test_emulate_cuda.py --ignore=tests/gpu/test_slices_cuda.py \
    > "$OUT/pytest.log" 2>&1; echo "A exit $?" ) &
on E && ( PRISM_GPU_TABLES=$OUT timeout "$T" $PY --basetemp=/tmp/pt-e -m gpu -v tests/gpu/test_emulate_cuda.py \
    > "$OUT/emulate-pytest.log" 2>&1; echo "E exit $?" ) &
on S && ( PRISM_GPU_TABLES=$OUT timeout "$T" $PY --basetemp=/tmp/pt-s -m gpu -v -s tests/gpu/test_swap.py \
    > "$OUT/swap-pytest.log" 2>&1; echo "S exit $?" ) &
on K && ( timeout "$T" $PY --basetemp=/tmp/pt-k -m gpu -v tests/gpu/test_capture_cuda.py > "$OUT/capture-pytest.log" 2>&1
  echo "K exit $?" ) &
on B && ( PRISM_GPU_TABLES=$OUT timeout "$T" $PY --basetemp=/tmp/pt-b -m gpu -v -s tests/gpu/test_memory_oom.py > "$OUT/memory-pytest.log" 2>&1
  echo "B exit $?" ) &
on C && ( if [ -n "$SAN" ]; then  # the kernel is built first, outside the sanitizer (nvcc need not run under it)
    { python3 -c "from prism.runtime.emulate import fold_cuda; fold_cuda.module(); print('fold kernel built')"
      timeout "$T" "$SAN" --tool memcheck --error-exitcode 3 \
      python3 -m pytest -p no:cacheprovider --basetemp=/tmp/pt-c -q -m gpu tests/gpu/test_fold_cuda.py; } \
      > "$OUT/sanitizer.log" 2>&1
    echo "C exit $?"
  else echo "C: no compute-sanitizer on this host" | tee "$OUT/sanitizer.log"; fi ) &
on L && ( PRISM_GPU_TABLES=$OUT timeout "$T" $PY --basetemp=/tmp/pt-l -m gpu -v -s tests/gpu/test_slices_cuda.py \
    > "$OUT/slices-pytest.log" 2>&1; echo "L exit $?" ) &
on D && ( timeout "$T" python3 tests/gpu/host_scale.py --out "$OUT" --sizes 8,32,64 > "$OUT/host_scale.log" 2>&1
  echo "D exit $?" ) &
wait
date -u
for f in pytest emulate-pytest swap-pytest capture-pytest memory-pytest slices-pytest sanitizer; do
  [ -f "$OUT/$f.log" ] && { echo "== $f"; grep -E "PASSED|FAILED|ERROR|passed|failed|SUMMARY" "$OUT/$f.log" | tail -60; }
done
[ -f "$OUT/host_scale.log" ] && { echo "== host_scale"; tail -8 "$OUT/host_scale.log"; }
cat "$OUT/memory_fidelity.md" 2>/dev/null
tar czf "$DEST/results.tgz" -C "$OUT" . && ls -la "$OUT"
