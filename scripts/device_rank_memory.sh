#!/usr/bin/env bash
# A capture rank's private memory against W on the 16-core accelerator host (issue 25 item 2), capture only.
#   PKGS=DIR bash scripts/device_rank_memory.sh OUT TOTAL_S RUN [RUN ...]
#   RUN = NAME:BUDGET_S:SIZES[:weak]   one `prism bench capture` invocation (payloads on, 2 steps, P=$DEVICES,
#         default 16) on the bench's cost layouts (`capture_scale.LAYOUTS`) or with `weak` on tp2·pp2·ep2·dp(W/4)
# The next session's two calls (docs/benchmarks.md, "Session 11"):
#   PKGS=.whl bash scripts/device_rank_memory.sh $OUT 540 weak:540:16,1024,8192:weak
#   PKGS=.whl bash scripts/device_rank_memory.sh $OUT 540 cost:540:256,1024,8192
# Each row of OUT/NAME.json has rank_private_mib_median / _max (each rank's smaps_rollup at its end) and the
# tree's PSS peak; OUT/profile-w64.txt (when 60 s are left after the runs; PROFILE=0: not) is
# scripts/rank_memory.py at W=64: where a rank's private pages are, by mapping and by the objects on them.
# A RUN gets min(BUDGET_S, what is left of TOTAL_S); `timeout` stops it 25 s after its budget (10 s more to
# SIGKILL); the bench skips a size whose extrapolated capture or memory does not fit. Ends within TOTAL_S + ~40 s.
set -uo pipefail
begin=$(date +%s) out=$1 total=$2 py=${PYTHON:-python3}
shift 2
source scripts/device_site.sh
prepare_host device_rank_memory "${PKGS:-.whl}" "$py" || exit 2
mkdir -p "$out"
{ date -u; nproc; free -g | head -2; echo "ulimit -n $(ulimit -n)"
  $py -c "import sys, torch, pyarrow; print(sys.version.split()[0], torch.__version__, pyarrow.__version__)"
} 2>&1 | tee "$out/host.txt"
for spec in "$@"; do
    IFS=: read -r name budget sizes weak <<< "$spec"
    left=$((total - ($(date +%s) - begin)))
    [ "$left" -lt "$budget" ] && budget=$left
    if [ "$budget" -lt 30 ]; then
        echo "$name: not started: ${left} s left of the call's ${total} s" | tee -a "$out/tables.txt"
        continue
    fi
    echo "$name: W=$sizes ${weak:+(weak) }budget ${budget} s, started at $(($(date +%s) - begin)) s" | tee -a "$out/tables.txt"
    timeout -s TERM -k 10 $((budget + 25)) $py -m prism.bench.capture_scale --sizes "$sizes" \
        --devices "${DEVICES:-16}" --budget "$budget" --json "$out/$name.json" --out "/tmp/prism-mem-$name" \
        ${weak:+--weak} > "$out/$name.log" 2>&1
    echo "$name exit $? after $(($(date +%s) - begin)) s" >> "$out/$name.log"
    tail -n 30 "$out/$name.log" >> "$out/tables.txt"
done
left=$((total - ($(date +%s) - begin)))
if [ "$left" -ge 60 ] && [ "${PROFILE:-1}" = 1 ]; then
    timeout -s TERM -k 10 $((left - 5)) $py scripts/rank_memory.py --sizes 64 --devices "${DEVICES:-16}" \
        > "$out/profile-w64.txt" 2>&1
    echo "profile exit $? after $(($(date +%s) - begin)) s" | tee -a "$out/tables.txt"
fi
cat "$out/tables.txt"
