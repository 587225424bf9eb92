#!/usr/bin/env bash
# Phase 1 with the representative slices at scale on the 16-core accelerator host, CPU only (issue 25).
#   PKGS=DIR bash scripts/device_scale_slices.sh OUT TOTAL_S RUN [RUN ...]
#   RUN = NAME:BUDGET_S:SIZES[:weak]   one `prism bench capture --pipeline --slices --emulate` invocation:
#         SIZES (comma-separated, in order) on the bench's cost layouts (`capture_scale.LAYOUTS`), or with
#         `weak` on tp2·pp2·ep2·dp(W/4) (`scale_slices.WEAK`: a rank's work fixed, DP grows)
# The two host calls (docs/benchmarks.md, "Session 10"):
#   PKGS=/work/pkgs bash scripts/device_scale_slices.sh $OUT 550 w8192:550:8192:weak
#   PKGS=/work/pkgs bash scripts/device_scale_slices.sh $OUT 550 weak:550:16,128,1024,2048,4096:weak
# Each size: capture on P=$DEVICES (16) slots, graph, plan --representative, the bare graph's calibration
# (for comparison), every measured slice run for real, durations/transfers from the slices (borrowed by rank
# class), calibrate from them, emulate one sandbox rank, summary, report. Time: a RUN gets min(BUDGET_S, what
# is left of TOTAL_S from this script's start); the bench stops a stage that would not end in its run's budget
# and skips a size whose extrapolated cost does not fit; `timeout` stops the run 25 s after its budget whatever
# happens (then 10 s more to SIGKILL); a RUN with < 30 s left is not started. So the script ends within
# TOTAL_S + ~40 s: TOTAL_S 550 for a 600 s call. Output, written as it is measured (a killed call still returns it): OUT/NAME.json
# (the rows, rewritten after every stage: a failing stage keeps the earlier stages' numbers), OUT/NAME.log,
# OUT/host.txt, OUT/tables.txt (every run's per-stage table, also printed last).
# STAGES='--emulate': the stages after the capture without the slice runs (the bare graph's calibration; the
# cost table's stages); default '--slices --emulate'. STAGES=capture: the capture alone (no --pipeline).
# REPORTS=DIR: each size's report.html is kept as DIR/report-wW.html (e.g. REPORTS=$OUT).
# The host lacks polars, duckdb, jsonschema (+ attrs, referencing, rpds-py, jsonschema-specifications), pyyaml,
# plotly (+ narwhals): cp312 wheels in $PKGS (default .whl); checked before anything runs.
set -uo pipefail
out=$1 total=$2; shift 2
py=${PYTHON:-python3}
begin=$(date +%s)
mkdir -p "$out"
source scripts/device_site.sh
prepare_host device_scale_slices "${PKGS:-.whl}" "$py" || exit 2
{ date -u; nproc; free -g | head -2; echo "ulimit -n $(ulimit -n)"; df -h /dev/shm /tmp | tail -2
  $py -c "import sys, torch, polars, duckdb; print(sys.version.split()[0], torch.__version__, polars.__version__, duckdb.__version__)"
} 2>&1 | tee "$out/host.txt"
# every module a stage imports (the report's plotly is imported only when it runs: check it now)
$py - <<'EOF' 2>&1 | tee -a "$out/host.txt" || exit 2
import importlib, sys
missing = []
for name in ("polars", "duckdb", "pyarrow", "numba", "jsonschema", "yaml", "plotly.graph_objects", "narwhals",
             "prism.slices.run", "prism.calibrate.from_slices", "prism.calibrate.stage", "prism.summary",
             "prism.report.html", "prism.report.stage", "prism.bench.emulate"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing.append(f"{name} ({exc})")
if missing:
    sys.exit("device_scale_slices: not importable here: " + "; ".join(missing)
             + ": carry its wheel (cp312) in $PKGS and run again")
print("imports: every stage's modules found")
EOF
run() {  # NAME BUDGET SIZES [weak]
    local name=$1 budget=$2 sizes=$3 weak=${4:-} left
    left=$((total - ($(date +%s) - begin)))
    [ "$left" -lt "$budget" ] && budget=$left
    if [ "$budget" -lt 30 ]; then
        echo "$name: not started: ${left} s left of the call's ${total} s" | tee -a "$out/tables.txt"
        return 0
    fi
    echo "$name: W=$sizes ${weak:+(weak) }budget ${budget} s, started at $(($(date +%s) - begin)) s" | tee -a "$out/tables.txt"
    local stages="--pipeline ${STAGES:---slices --emulate}"
    [ "${STAGES:-}" = capture ] && stages=""
    timeout -s TERM -k 10 $((budget + 25)) $py -m prism.bench.capture_scale --sizes "$sizes" \
        --devices "${DEVICES:-16}" $stages --budget "$budget" --json "$out/$name.json" \
        --out "/tmp/prism-scale-$name" ${weak:+--weak} ${REPORTS:+--keep-report "$REPORTS"} > "$out/$name.log" 2>&1
    echo "$name exit $? after $(($(date +%s) - begin)) s" | tee -a "$out/$name.log" "$out/tables.txt"
}  # (the bench removes each size's job; a killed run's is left: the host is fresh each call, and removing
   # 8192 ranks' files could take the seconds the call has left)
for spec in "$@"; do
    IFS=: read -r name budget sizes weak <<< "$spec"
    run "$name" "$budget" "$sizes" "$weak"
done
$py -m prism.bench.scale_tables "$out"/*.json 2>&1 | tee -a "$out/tables.txt"
ls -la "$out"
