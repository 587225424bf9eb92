#!/usr/bin/env bash
# Issue 12, session 7, on the 16-core accelerator host (CPU only): what immortal zygote objects save a rank,
# and what bounds capture throughput. One device call:
#   PKGS=../s5fid/.pkgs PYSPY=DIR scripts/device_probe_s7.sh OUT
# 1. tests/programs/immortal_probe.py (stdlib only) with PRISM_IMMORTAL=0 and 1: a forked child's growth.
# 2. `prism bench capture --sizes 256 --devices 16` with PRISM_IMMORTAL=0, then 1 (OUT/w256-off.json, -on.json):
#    private MiB a rank median/max, tree PSS, wall.
# 3. scripts/rank_memory.py --sizes 64 --devices 16 (immortal on): where a rank's private pages are.
# 4. W=1024 capture (bench, P=16) with py-spy recording the zygote (its coordinator) if PYSPY holds the
#    py-spy wheel (OUT/zygote-w1024.txt: collapsed stacks).
#    Each row has the coordinator's CPU seconds and wall, the fork loop's seconds, packets and messages.
# (Ran at 33f18d4, which also ran step 4 with PRISM_CAPTURE_BATCH=0 (OUT/w1024-nobatch.json); that variable,
# the batching it turned off, and the rows' "requests" were removed after: the step is gone from this script.)
set -uo pipefail
out=$1 py=${PYTHON:-python3} pkgs=${PKGS:-}
mkdir -p /tmp/site
if [ -n "$pkgs" ]; then
    if compgen -G "$pkgs/*.whl" > /dev/null; then
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$pkgs"/*.whl || exit
    fi
    for t in "$pkgs"/*.tar.xz; do [ -e "$t" ] && { tar -xJf "$t" -C /tmp/site || exit; }; done
fi
spy=
if [ -n "${PYSPY:-}" ] && compgen -G "$PYSPY/py_spy*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/pyspy "$PYSPY"/py_spy*.whl && spy=/tmp/pyspy/bin/py-spy
fi
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
ulimit -n "$(ulimit -Hn)"
{ date -u; nproc; free -g | head -2; $py -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
  echo "py-spy: ${spy:-none}"; } 2>&1 | tee "$out/host.txt"
echo "== 1. immortal_probe (stdlib): PRISM_IMMORTAL=0 then 1"
for v in 0 1 0 1; do PRISM_IMMORTAL=$v $py tests/programs/immortal_probe.py "$PWD"; done
for v in off on; do
    echo "== 2. prism bench capture --sizes 256 --devices 16, immortal $v"
    PRISM_IMMORTAL=$([ $v = on ] && echo 1 || echo 0) $py -m prism.bench.capture_scale --sizes 256 --devices 16 \
        --json "$out/w256-$v.json" --out /tmp/probe-w256-$v 2>&1 | grep -v "^  W=" | tail -4
done
echo "== 3. rank_memory --sizes 64 --devices 16 (immortal on)"
$py scripts/rank_memory.py --sizes 64 --devices 16
echo "== 4. W=1024 capture, py-spy on the zygote: ${spy:-none}"
$py -m prism.bench.capture_scale --sizes 1024 --devices 16 --json "$out/w1024.json" --out /tmp/probe-w1024 \
    > /tmp/w1024.log 2>&1 &
bench=$!
if [ -n "$spy" ]; then
    for _ in $(seq 1 200); do z=$(pgrep -f "prism.runtime.launch.zygote" | head -1); [ -n "$z" ] && break; sleep 0.1; done
    [ -n "${z:-}" ] && $spy record -p "$z" -r 100 --format raw -o "$out/zygote-w1024.txt" --nonblocking \
        > /tmp/pyspy.log 2>&1
    tail -2 /tmp/pyspy.log
fi
wait $bench
tail -4 /tmp/w1024.log
for f in "$out"/w*.json; do
    echo "== $f"; $py -c "import json,sys; [print({k: v for k, v in r.items() if k in ('W','wall_s','pss_peak','rank_private_mib_median','rank_private_mib_max','messages','requests','switches','events','events_per_s','coordinator_cpu_s','coordinator_wall_s','fork_s','immortal')}) for r in json.load(open(sys.argv[1]))]" "$f"
done
date -u
