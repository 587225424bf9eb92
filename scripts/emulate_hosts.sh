#!/usr/bin/env bash
# An emulation over two "hosts" on this machine against one on one host (docs/design.md, "An emulation over
# several hosts"): the dp4-tp2-ep4 reference job (W=8, 2 steps) captured on one host, calibrated, then
# emulated with sandbox ranks 2 and 6 by one launcher and by two (`--nnodes 2`, 4 ranks each, localhost).
#   scripts/emulate_hosts.sh OUT        -> OUT/{one,two}/meta.json (the launches' raw/meta.json), OUT/*.log
# PRISM: the prism command (default .venv/bin/prism).
set -euo pipefail
out=$1
prism=${PRISM:-.venv/bin/prism}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prog=(-m prism.workloads.moe_gpt --steps 2 --microbatches 2 --tp 2 --dp 4 --ep 4)
mkdir -p "$out/one" "$out/two"
$prism launch --nproc 8 --devices 2 --mode capture --out "$work/job/capture" "${prog[@]}" > "$out/capture.log" 2>&1
$prism graph --job "$work/job" > "$out/graph.log" 2>&1
$prism calibrate --job "$work/job" > "$out/calibrate.log" 2>&1
emu=(--mode emulate --capture "$work/job/capture" --sandbox 2,6 --devices 1)
$prism launch --nproc 8 "${emu[@]}" --out "$work/one" "${prog[@]}" > "$out/one.log" 2>&1
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for k in 0 1; do
    $prism launch --nnodes 2 --node-rank $k --master-addr 127.0.0.1 --master-port "$port" --nproc 4 "${emu[@]}" \
        --out "$work/two" "${prog[@]}" > "$out/two-host$k.log" 2>&1 &
done
wait -n && wait -n
cp "$work/one/raw/meta.json" "$out/one/meta.json"
cp "$work/two/raw/meta.json" "$out/two/meta.json"
