#!/usr/bin/env bash
# The replay server's late issues on this machine (issue 24, docs/fidelity.md "Session 13"): capture one bench
# config (`prism bench fidelity`'s layout and model) on P device slots, run its untimed slices the way the bench
# does, and print `scripts/fidelity_burst.py --table` for them (without a truth run: the capture's async ops).
#   bash scripts/replay_late_local.sh WORK [CONFIG=dp8-var] [P=2] [STEPS=8]
# Writes WORK/CONFIG/prism0 (capture, graph, slices) and WORK/CONFIG/log.txt; a count of late issues, not a
# timing: on a loaded 2-core machine the slice ranks and the server share the cores.
set -euo pipefail
work=$1 cfg=${2:-dp8-var} p=${3:-2} steps=${4:-8}
py=${PYTHON:-.venv/bin/python}
args=$($py -c "import sys; from prism.bench.fidelity import BY_NAME, MODEL
print(' '.join(BY_NAME[sys.argv[1]].args(int(sys.argv[2]), MODEL)))" "$cfg" "$steps")
job=$work/$cfg/prism0 log=$work/$cfg/log.txt
rm -rf "$job" && mkdir -p "$job"
run() { echo "\$ $*" >> "$log"; "$@" >> "$log" 2>&1 || { echo "failed: $* (see $log)" >&2; tail -5 "$log" >&2; exit 1; }; }
# shellcheck disable=SC2086  # the layout's arguments split on spaces
run $py -m prism.cli launch --nproc "$($py -c "from prism.bench.fidelity import BY_NAME; print(BY_NAME['$cfg'].world)")" \
    --mode capture --devices "$p" --out "$job/capture" -m prism.workloads.moe_gpt $args
run $py -m prism.cli graph --job "$job" --raw "$job/capture/raw" --out "$job/graph"
run $py -m prism.slices.plan --job "$job" --devices "$p"
for k in $($py -c "import pyarrow.parquet as pq; t = pq.read_table('$job/slices/plan.parquet')
print(' '.join(map(str, sorted(set(t.filter(t.column('measured')).column('slice').to_pylist())))))"); do
    run $py -m prism.slices.run --job "$job" --slice "$k"
done
$py scripts/fidelity_burst.py --table "$work/$cfg"
