#!/usr/bin/env bash
# Issue 25's W=16 -> 128 jump on the 16-core accelerator host, CPU only (docs/benchmarks.md, "Session 11"), one call:
#   PKGS=.whl bash scripts/device_replay_cores.sh $OUT 550
# 1. the gloo ring alone (scripts/replay_ring.py, ~60 s): a 12,928 B and a 4 B all-reduce of 16 and 32 members as a
#    slice run lays out a DP group (member 0 on core 0, the other members in one process on cores 1-15, then on
#    core 15 alone), and of 16 members as the job does (16 processes, one a core): OUT/ring.jsonl;
# 2. the weak layout at W=128 through Phase 1 with slices (`device_scale_slices.sh`), with DEVICES=16 (slices of 16,
#    the replay server on no core of its own) and DEVICES=15 (slices of at most 15 ranks, one core left to the
#    server): OUT/p16/, OUT/p15/, each run's tables (tables.txt: with the replay server's ops per slice,
#    `replay_ops` in p*.json).
# Time: the ring at most 210 s (~60 s on the host), then the rest of TOTAL_S split between the two W=128 runs (each ~190 s at P=16 in
# session 10: capture 12 s, slices 14 s, emulate 15 s, the rest < 10 s; the bench skips what does not fit).
# Set PYTHON=.venv/bin/python PKGS=/tmp/nopkgs to try it on a workstation (DEVICES_A/DEVICES_B, RING_CORES to fit).
set -uo pipefail
out=$1 total=$2
py=${PYTHON:-python3}
begin=$(date +%s)
mkdir -p "$out"
source scripts/device_site.sh
install_site "${PKGS:-.whl}" "$py" || { echo "device_replay_cores: installing the wheels of ${PKGS:-.whl} failed"; exit 2; }
ncores=$(nproc)
last=$((ncores - 1))
a=${DEVICES_A:-16} b=${DEVICES_B:-15}
{ date -u; echo "nproc $ncores"; uptime; } | tee "$out/host.txt"
ring() { timeout -k 5 "$1" $py scripts/replay_ring.py "${@:2}" --out "$out/ring.jsonl" >> "$out/ring.log" 2>&1 \
         || echo "ring $* : exit $?" | tee -a "$out/ring.log"; }
ring 90 --members 16,32 --bytes 12928,4 --cores 0 --server-cores "1-$last"
ring 60 --members 16,32 --bytes 12928 --cores 0 --server-cores "$last"
ring 60 --members "${RING_PROCS:-16}" --bytes 12928,4 --procs --cores "0-$last"
left=$((total - ($(date +%s) - begin)))
half=$(((left - 20) / 2))
echo "ring done at $(($(date +%s) - begin)) s; ${half} s for each W=128 run" | tee -a "$out/host.txt"
DEVICES=$a PKGS=${PKGS:-.whl} PYTHON=$py bash scripts/device_scale_slices.sh "$out/p$a" "$half" "p$a:$half:${SIZES:-128}:weak"
DEVICES=$b PKGS=${PKGS:-.whl} PYTHON=$py bash scripts/device_scale_slices.sh "$out/p$b" "$half" "p$b:$half:${SIZES:-128}:weak"
ls -la "$out" "$out"/p*
