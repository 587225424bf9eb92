#!/usr/bin/env bash
# The W=8/W=16 fidelity matrix on the 16-core accelerator host, CPU only (see docs/fidelity.md).
#   scripts/device_fidelity.sh OUT BUDGET_S CONFIGS
# Needs the wheels the host lacks in .whl/ (polars, polars-runtime-32, jsonschema and its three needs).
set -uo pipefail
out=$1 budget=$2 configs=$3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
{ nproc; lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\))"; uptime
  python3 -c "import time; t=time.time(); import torch; print(f'import torch {time.time()-t:.2f} s', torch.__version__)"
} 2>&1 | tee "$out/host.txt"
python3 -m prism.bench.fidelity --matrix device --configs "$configs" --repeats 5 --steps 8 --budget "$budget" \
    --out "$out" --work /tmp/fidelity-work 2>&1 | tee "$out/bench.log"
# one config's stage log (the first), for where the time went
cp "$(ls -d /tmp/fidelity-work/*/ | head -1)log.txt" "$out/first-config-log.txt" 2>/dev/null || true
