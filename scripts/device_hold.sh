#!/usr/bin/env bash
# The emulated sandbox, two prisms on one calibrated job per config (A/B), on the 16-core host, CPU only
# (docs/fidelity.md, device-10). `python -m prism.bench.fidelity_hold` per config: capture, slices,
# calibrate, then `prism emulate` with the prism of BASE ("before") and with this one ("after").
#   BASE=TREE [PKGS=DIR] [STREAM_TIMEOUT=S] scripts/device_hold.sh OUT CONFIGS_A [CONFIGS_B]
# With CONFIGS_B, two streams run at once, each on its own 8 cores (taskset 0-7 and 8-15). PKGS: the
# packages the host lacks, as in scripts/device_fidelity.sh. Writes OUT/host.txt, OUT/<stream>.log and
# OUT/jobs.tgz (each config's hold.json and the tables it is computed from: `--rescore` recomputes it).
set -uo pipefail
out=$1
pkgs=${PKGS:-.whl}
base=$(realpath "${BASE:?BASE=TREE, the prism tree to compare with}")
source "$(dirname "$0")/device_site.sh"
install_site "$pkgs" || exit
{ nproc; lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|L3)"; uptime; date -u
  python3 -c "import torch; print('torch', torch.__version__)"
} 2>&1 | tee "$out/host.txt"
work=/tmp/hold-work
stream() {  # name cores configs
    mkdir -p "$work/$1"
    for c in ${3//,/ }; do
        timeout "${STREAM_TIMEOUT:-100000}" taskset -c "$2" python3 -m prism.bench.fidelity_hold --config "$c" \
            --work "$work/$1" --base "$base" --timeout 200
    done > "$out/$1.log" 2>&1
}
if [ $# -ge 3 ]; then
    stream a 0-7 "$2" & stream b 8-15 "$3" & wait
else
    stream a "${CORES:-0-15}" "$2"
fi
cat "$out"/*.log
cd "$work" && tar -czf "$out/jobs.tgz" --ignore-failed-read */*/hold.json */*/log.txt */*/graph/comms.parquet \
    */*/graph/ranks.parquet */*/slices/plan.parquet */*/slices/transfers.parquet */*/calibrated \
    */*/emulation_*/events.parquet */*/emulation_*/iterations.parquet */*/emulation_*/meta.json 2>&1 | tail -3
ls -la "$out"
