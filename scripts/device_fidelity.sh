#!/usr/bin/env bash
# The W=8 fidelity matrix on the 16-core accelerator host, CPU only (see docs/fidelity.md).
#   scripts/device_fidelity.sh OUT BUDGET_S CONFIGS_A [CONFIGS_B]
# With CONFIGS_B, two streams run at once, each on its own 8 cores (taskset 0-7 and 8-15): every rank of
# a stream is pinned inside its half (truth and prism runs alike). Needs the wheels the host lacks in
# .whl/ (polars, polars-runtime-32, jsonschema and its three needs). Writes OUT/host.txt, OUT/<stream>.log
# and OUT/artifacts.tar.xz.part-* (each config's tables: fidelity.{md,json}, truth0 and capture graphs,
# slice events; enough to re-score offline with `prism bench fidelity --rescore DIR`).
set -uo pipefail
out=$1 budget=$2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
{ nproc; lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|L3)"; uptime
  python3 -c "import time; t=time.time(); import torch; print(f'import torch {time.time()-t:.2f} s', torch.__version__)"
} 2>&1 | tee "$out/host.txt"
work=/tmp/fidelity-work
stream() {  # name cores configs
    mkdir -p "$work/$1"
    taskset -c "$2" python3 -m prism.bench.fidelity --configs "$3" --repeats 5 --steps 8 --budget "$budget" \
        --out "$work/$1" --work "$work/$1" > "$out/$1.log" 2>&1
}
if [ $# -ge 4 ]; then
    stream a 0-7 "$3" & stream b 8-15 "$4" & wait
else
    stream a 0-15 "$3"
fi
cat "$out"/*.log
cd "$work" && tar -cf - --exclude='*.arrow' --exclude=payloads --exclude='truth[1-9]' --exclude='*.tmp' . \
    | xz -6 -T4 | split -b 15M - "$out/artifacts.tar.xz.part-"
ls -la "$out"
