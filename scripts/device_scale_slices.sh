#!/usr/bin/env bash
# Phase 1 with the representative slices at scale on the 16-core accelerator host, CPU only (issue 25).
#   scripts/device_scale_slices.sh OUT WEAK_BUDGET_S WEAK_SIZES COST_BUDGET_S COST_SIZES
# e.g. scripts/device_scale_slices.sh $OUT 250 16,128,1024 290 1024,2048,4096:
#   1. weak scaling: `prism bench capture --weak --pipeline --slices --emulate` (tp2·pp2·ep2·dp(W/4): a rank's
#      work fixed, DP grows) -> OUT/weak.{log,json}
#   2. cost against W: the same on the bench's scale layouts (`capture_scale.LAYOUTS`) -> OUT/cost.{log,json}
# Each: capture on P=$DEVICES (16) slots, graph, plan --representative, every measured slice run for real,
# durations/transfers from the slices (borrowed by rank class), calibrate from them, emulate one sandbox
# rank, summary, report; a size whose extrapolated cost does not fit what is left of its budget is not
# started and says so. The host lacks polars, duckdb and jsonschema (+ attrs, referencing, rpds-py,
# jsonschema-specifications; `prism.slices.run` reads the config): wheels (cp312) or unpacked wheels as *.tar.xz
# in $PKGS (default .whl).
set -uo pipefail
out=$1 wbudget=$2 wsizes=$3 cbudget=$4 csizes=$5 py=${PYTHON:-python3}
source scripts/device_site.sh
install_site "${PKGS:-.whl}" "$py" || exit
ulimit -Hn 65536 2>/dev/null
ulimit -n "$(ulimit -Hn)"
{ date -u; nproc; free -g | head -2; echo "ulimit -n $(ulimit -n)"; df -h /dev/shm | tail -1
  $py -c "import sys, torch, polars, duckdb; print(sys.version.split()[0], torch.__version__, polars.__version__, duckdb.__version__)"
} 2>&1 | tee "$out/host.txt"
run() {  # NAME BUDGET SIZES [bench options]
    local name=$1 budget=$2 sizes=$3; shift 3
    [ -n "$sizes" ] || return 0
    timeout -s TERM -k 20 $((budget + 30)) $py -m prism.bench.capture_scale --sizes "$sizes" \
        --devices "${DEVICES:-16}" --pipeline --slices --emulate --budget "$budget" --json "$out/$name.json" \
        --out "/tmp/prism-scale-$name" "$@" > "$out/$name.log" 2>&1
    echo "$name exit $?" | tee -a "$out/$name.log"
    rm -rf "/tmp/prism-scale-$name"
}
run weak "$wbudget" "$wsizes" --weak
run cost "$cbudget" "$csizes"
ls -la "$out"
