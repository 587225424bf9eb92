#!/usr/bin/env bash
# Capture at scale on the 16-core accelerator host, CPU only (issue 12; the table in docs/benchmarks.md).
#   scripts/device_scale.sh OUT BUDGET_S SIZES
# e.g. scripts/device_scale.sh $OUT 470 1024,4096,2048,8192: `prism bench capture --pipeline` on P=16 slots
# ($DEVICES, default 16; the reference workload, TP·PP·DP·EP layouts, workload warm-up in the zygote), then graph, slice plan
# (--representative) and calibration of each size; a size whose extrapolated cost does not fit in what is
# left of BUDGET_S is skipped and says so. Writes OUT/host.txt, OUT/scale.log (the tables), OUT/scale.json
# (every row) and OUT/captures.log (the launcher's progress lines of each capture).
# The wheels the host lacks (polars, polars-runtime) are installed from $WHL (default ../whl) if present.
set -uo pipefail
out=$1 budget=$2 sizes=$3 whl=${WHL:-../whl} py=${PYTHON:-python3}
if compgen -G "$whl/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl || exit
fi
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
ulimit -n "$(ulimit -Hn)"
{ date -u; nproc; free -g | head -2; echo "ulimit -n $(ulimit -n) -u $(ulimit -u)"; df -h /dev/shm | tail -1
  cat /proc/sys/kernel/pid_max /proc/sys/kernel/threads-max
  $py -c "import sys, torch, polars; print(sys.version.split()[0], torch.__version__, polars.__version__)"
} 2>&1 | tee "$out/host.txt"
work=/tmp/prism-scale-work
$py -m prism.bench.capture_scale --sizes "$sizes" --devices "${DEVICES:-16}" --pipeline --budget "$budget" \
    --json "$out/scale.json" --out "$work" 2>&1 | tee "$out/scale.log"
code=$?
for f in "$work"/w*-capture.log; do
    [ -f "$f" ] && { echo "== $f"; grep -v "^moe_gpt: rank " "$f" | tail -40; }
done > "$out/captures.log" 2>&1
ls -la "$out"
exit $code
