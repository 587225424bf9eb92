#!/usr/bin/env bash
# Capture at scale on the 16-core accelerator host, CPU only (issue 12; the table in docs/benchmarks.md).
#   scripts/device_scale.sh OUT BUDGET_S SIZES
# e.g. scripts/device_scale.sh $OUT 480 1024,4096,2048,8192: `prism bench capture --pipeline --emulate` on P=16
# slots ($DEVICES, default 16; the reference workload, TP·PP·DP·EP layouts, workload warm-up in the zygote),
# then graph, slice plan (--representative), calibration and `prism emulate` of one sandbox rank of each
# size; a size whose extrapolated cost does not fit in what is left of BUDGET_S, or whose memory (at the
# private MiB a rank measured at the previous size) does not fit the machine, is not started and says so.
# Then, if EMULATE_SIZES is set (e.g. 16,64,256) and at least EMULATE_NEED_S (default 150) of the budget is
# left: `prism bench emulate --sizes EMULATE_SIZES` (captured on P=2, issue 8 item 3), else a line saying why not.
# Writes OUT/host.txt, OUT/scale.log (the tables), OUT/scale.json (every row), OUT/captures.log (the
# launcher's progress lines of each capture) and OUT/emulate.json + OUT/emulate.log.
# The packages the host lacks (polars and its runtime, duckdb) are installed from $PKGS (default ../whl) if
# present: wheels (*.whl) and unpacked wheels packed as *.tar.xz (see scripts/device_fidelity.sh).
set -uo pipefail
out=$1 budget=$2 sizes=$3 whl=${PKGS:-${WHL:-../whl}} py=${PYTHON:-python3}
mkdir -p /tmp/site
if compgen -G "$whl/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl || exit
fi
for t in "$whl"/*.tar.xz; do [ -e "$t" ] && { tar -xJf "$t" -C /tmp/site || exit; }; done
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
# The host's Python packages have no byte-code cache it may write: every process that imports torch compiles
# torch._dynamo & co. again (~8.5 s of each capture's zygote start, docs/results/scale/s7/probe). PYCACHE=1: one
# writable cache (the first process compiles, the later ones load). Off by default: with it, W=1024's ranks
# had 14.7 MiB private each instead of 10.8 (docs/results/scale/s7/call2, not understood yet).
[ "${PYCACHE:-0}" = 1 ] && export PYTHONPYCACHEPREFIX=/tmp/prism-pycache
# W=8192 needs 32,832 open files with pipes for the ranks' output (prism falls back to files, 16,448, where
# the hard limit is lower: prism.runtime.launch.limits.rank_output); try to raise the hard limit first (root only)
ulimit -Hn 65536 2>/dev/null
ulimit -n "$(ulimit -Hn)"
{ date -u; nproc; free -g | head -2; echo "ulimit -n $(ulimit -n) -u $(ulimit -u)"; df -h /dev/shm | tail -1
  cat /proc/sys/kernel/pid_max /proc/sys/kernel/threads-max
  $py -c "import sys, torch, polars; print(sys.version.split()[0], torch.__version__, polars.__version__)"
} 2>&1 | tee "$out/host.txt"
work=/tmp/prism-scale-work
began=$SECONDS
# the launcher's progress lines of each capture go to OUT/captures.log however this script ends (an outer
# `timeout` included: give it BUDGET_S + 60 at least, the bench stops a late stage itself)
collect() {
    for f in "$work"/w*-capture.log; do
        [ -f "$f" ] && { echo "== $f"; grep -v "^moe_gpt: " "$f" | tail -40; }
    done > "$out/captures.log" 2>&1
}
trap collect EXIT
trap 'kill -TERM "$bench" 2>/dev/null; echo "device_scale.sh: stopped by a signal"; exit 143' TERM INT
$py -m prism.bench.capture_scale --sizes "$sizes" --devices "${DEVICES:-16}" --pipeline --emulate \
    --budget "$budget" --json "$out/scale.json" --out "$work" > >(tee "$out/scale.log") 2>&1 &
bench=$!
wait "$bench"
code=$?
if [ -n "${EMULATE_SIZES:-}" ]; then
    left=$((budget - (SECONDS - began)))
    if [ "$left" -ge "${EMULATE_NEED_S:-150}" ]; then
        echo "== prism bench emulate --sizes $EMULATE_SIZES --devices 2 ($left s of the budget left)"
        timeout -s INT -k 20 "$left" $py -m prism.cli bench emulate --sizes "$EMULATE_SIZES" --devices 2 \
            --json "$out/emulate.json"
        echo "bench emulate exit $?"
    else
        echo "== prism bench emulate --sizes $EMULATE_SIZES: not run, $left s of the budget left < ${EMULATE_NEED_S:-150} s"
    fi 2>&1 | tee "$out/emulate.log"
fi
if [ -n "${PYCACHE_PAIR:-}" ]; then  # the byte-code cache's effect on a rank's private memory (W=PYCACHE_PAIR)
    left=$((budget - (SECONDS - began)))
    if [ "$left" -ge 70 ]; then
        for run in compiles cached; do
            echo "== W=$PYCACHE_PAIR, PYTHONPYCACHEPREFIX=/tmp/pycache-pair ($run)"
            PYTHONPYCACHEPREFIX=/tmp/pycache-pair timeout 60 $py -m prism.bench.capture_scale --sizes "$PYCACHE_PAIR" \
                --devices "${DEVICES:-16}" --json "$work/pair-$run.json" --out "$work/pair" 2>&1 | grep -E "^ +[0-9]+ " | tail -1
        done
    else
        echo "== byte-code cache pair: not run, $left s of the budget left"
    fi 2>&1 | tee "$out/pycache-pair.log"
fi
ls -la "$out"
exit $code
