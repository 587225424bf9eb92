#!/usr/bin/env bash
# The W=8 fidelity matrix on the 16-core accelerator host, CPU only (see docs/fidelity.md).
#   [REPEATS=5] [PASSES=1] [PKGS=.whl] [STREAM_TIMEOUT=S] [EXTRA="--no-emulate ..."] \
#       scripts/device_fidelity.sh OUT BUDGET_S CONFIGS_A [CONFIGS_B]
# With CONFIGS_B, two streams run at once, each on its own 8 cores (taskset 0-7 and 8-15): every rank of
# a stream is pinned inside its half (truth and prism runs alike). REPEATS: truth runs per config; EXTRA: more
# arguments of `prism bench fidelity` (split on spaces), e.g. --no-emulate or --prism-runs 3. Needs
# the packages the host lacks in PKGS: wheels (*.whl: polars, polars-runtime-32, jsonschema and its three
# needs) and/or unpacked wheels as *.tar.xz (extracted into the same site folder; e.g. duckdb, which
# `prism emulate` needs, and polars' runtime, xz-compressed to fit the device tool's 64 MiB carry limit).
# Writes OUT/host.txt, OUT/<stream>.log, OUT/<stream>/fidelity.json (the bench's --out) and
# OUT/artifacts.tar.xz.part-* (each config's tables: truth0 (raw and graph) and every other truth run's graph,
# capture graphs, slice events of both passes, calibrations, emulation; enough to re-score offline with
# `prism bench fidelity --rescore DIR`, and for `prism.bench.fidelity_terms` to compare two truth runs of one
# session: `--against DIR/truth1 DIR/truth0`).
set -uo pipefail
out=$1 budget=$2
pkgs=${PKGS:-.whl}
repeats=${REPEATS:-5}
source "$(dirname "$0")/device_site.sh"
install_site "$pkgs" || exit
{ nproc; lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|L3)"; uptime
  python3 -c "import time; t=time.time(); import torch; print(f'import torch {time.time()-t:.2f} s', torch.__version__)"
  python3 -c "import polars, duckdb, jsonschema; print('polars', polars.__version__, 'duckdb', duckdb.__version__)"
} 2>&1 | tee "$out/host.txt"
work=/tmp/fidelity-work
stream() {  # name cores configs
    mkdir -p "$work/$1" "$out/$1"
    timeout "${STREAM_TIMEOUT:-100000}" taskset -c "$2" python3 -m prism.bench.fidelity --configs "$3" --passes "${PASSES:-1}" \
        --repeats "$repeats" --steps 8 --budget "$budget" --out "$out/$1" --work "$work/$1" ${EXTRA:-} > "$out/$1.log" 2>&1
    rm -f "$out/$1/fidelity.md"  # the table is in the log; the device tool returns at most 8 files
    cp "$out/$1/fidelity.json" "$work/$1/" 2>/dev/null
}
if [ $# -ge 4 ]; then
    stream a 0-7 "$3" & stream b 8-15 "$4" & wait
else
    stream a 0-15 "$3"
fi
cat "$out"/*.log
cd "$work" && tar -cf - --exclude='*.arrow' --exclude=payloads --exclude='truth[1-9]/raw' --exclude='*.tmp' \
    --exclude='logs' . | xz -3 -T8 | split -b 15M - "$out/artifacts.tar.xz.part-"
ls -la "$out" "$out"/*/
