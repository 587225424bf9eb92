#!/usr/bin/env bash
# What sets a pinned W=1 run's speed on the H200 host, and PrismTrace's overhead with it taken out (issue 21
# item 6), in one device call. Session 13: a run of the reference workload ran at ~80 or ~100-128 ms a step
# whatever the variant, the level changing between runs and within them (docs/benchmarks.md, Session 13).
#   1. host facts: lscpu, this process's affinity, the SMT siblings of core 0 and of the last core, cpufreq's
#      governor, nvidia-smi's clocks;
#   2. while the benches run, scripts/host_sampler.py (every 0.5 s: each of those cores' clock, busy, irq and
#      steal share: samples.tsv) and nvidia-smi (SM/memory clock, power, utilisation: gpu.csv);
#   3. `prism bench overhead --device $DEVICE --nproc 1` (each round's run medians, the paired ratios and their
#      spread), its stderr lines stamped with the unix second to join with the samples:
#      stream-order (CUDA only): pytest tests/gpu/test_stream_order_cuda.py;
#      ref-last: the reference workload (`--microbatches 4`, launch-bound), REF_REPEATS (6) rounds, pinned to the
#      last core; gpu-bound-last: WORKLOAD_GPU (default ~1 s of fp32 matmuls a step, GPU-bound), GPU_REPEATS (3)
#      rounds of GPU_STEPS (8); optional (0 rounds unless asked): ref-core0 (CORE0_REPEATS, pinned to core 0) and
#      larger-last (BIG_REPEATS, `--hidden 1024 --layers 8 --seq-len 512`: CPU-bound on the H200, session 13).
# Usage (the device, from the repository root; PKGS: the wheels prism's deps come from, default .whl):
#   bash scripts/overhead_levels.sh $OUT 560
#   DEVICE=cpu PYTHON=.venv/bin/python STEPS=6 BIG_STEPS=4 REF_REPEATS=2 CORE0_REPEATS=1 BIG_REPEATS=1 \
#       WORKLOAD_BIG="--microbatches 2 --hidden 64" bash scripts/overhead_levels.sh /tmp/lev 560   (here, on CPU: ~1 min)
# Files: OUT/bench.txt (the three benches' tables), OUT/host.txt, OUT/log.txt, OUT/levels.tgz (the stamped logs,
# samples.tsv, gpu.csv). Expected on the H200: ~450 s (session 13: 5 reference rounds + 3 larger ones took 309 s).
# Each stage starts only when its budget is left of BUDGET_S and `timeout` stops it at what
# is left: the call ends within BUDGET_S + ~15 s.
set -uo pipefail
begin=$(date +%s)
out=${1:?usage: overhead_levels.sh OUT BUDGET_S} total=${2:-560}
py=${PYTHON:-python3} device=${DEVICE:-cuda} steps=${STEPS:-15} big_steps=${BIG_STEPS:-10}
mkdir -p "$out"
work=$(mktemp -d /tmp/prism-lev-XXXX)
log=$out/log.txt
source scripts/device_site.sh
gpu_host overhead_levels "$py" "$log" "$device" || exit 2  # scripts/device_site.sh
last=$($py -c "import os; print(max(os.sched_getaffinity(0)))")
first=$($py -c "import os; print(min(os.sched_getaffinity(0)))")
{ date -u; nproc; lscpu 2>&1 | head -n 30; echo "affinity: $(taskset -pc $$ 2>&1)"
  for c in "$first" "$last"; do
      echo "core $c siblings: $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null || echo '?')" \
           "governor: $(cat /sys/devices/system/cpu/cpu$c/cpufreq/scaling_governor 2>/dev/null || echo 'no cpufreq')"
  done
  command -v nvidia-smi > /dev/null && nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -n 60
  $py -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  git log -1 --format='prism %h %s' 2>/dev/null; } > "$out/host.txt" 2>&1

start_samplers "$py" "$first,$last" "$device"  # scripts/device_site.sh

STAGE_STAMP=1 STAGE_SLACK=8  # stage (scripts/device_site.sh): lines stamped to join with the samples
bench=($py -m prism.cli bench overhead --device "$device" --nproc 1)

# the emulate group thread against a side stream (tests/gpu/test_stream_order_cuda.py, ~5 s; never run on a GPU before)
[ "$device" = cuda ] && stage stream-order 40 $py -m pytest -q -p no:cacheprovider tests/gpu/test_stream_order_cuda.py
stage ref-last 250 "${bench[@]}" --steps "$steps" --repeats "${REF_REPEATS:-6}" --cores "$last" "--workload=${WORKLOAD:---microbatches 4}"
# GPU-bound (session 15): ~40 TFLOP of fp32 matmuls a step (experts 2 of 4 a token, 8192 tokens a microbatch),
# ~1 s of GPU a step against ~0.1 s of CPU issuing it; nvidia-smi's utilisation (gpu.csv) says whether it was
stage gpu-bound-last 200 "${bench[@]}" --steps "${GPU_STEPS:-8}" --repeats "${GPU_REPEATS:-3}" --cores "$last" \
    "--workload=${WORKLOAD_GPU:-$GPU_BOUND_WORKLOAD}"
[ "${CORE0_REPEATS:-0}" -gt 0 ] && stage ref-core0 170 "${bench[@]}" --steps "$steps" --repeats "$CORE0_REPEATS" --cores "$first" "--workload=${WORKLOAD:---microbatches 4}"
[ "${BIG_REPEATS:-0}" -gt 0 ] && stage larger-last 110 "${bench[@]}" --steps "$big_steps" --repeats "$BIG_REPEATS" --cores "$last" \
    "--workload=${WORKLOAD_BIG:---microbatches 4 --hidden 1024 --layers 8 --seq-len 512}"
stop_samplers
for b in ref-last gpu-bound-last ref-core0 larger-last stream-order; do
    [ -f "$work/$b.log" ] || continue
    echo "== $b"
    if [ "$b" = stream-order ]; then tail -n 5 "$work/$b.log" | cut -d' ' -f2-
    else sed -n '/prism bench overhead:/,$p' "$work/$b.log" | cut -d' ' -f2-; fi
done > "$out/bench.txt"
cat "$out/bench.txt"
cp "$log" "$work/"
tar czf "$out/levels.tgz" -C "$work" . && rm -rf "$work"
echo "overhead_levels: done in $(($(date +%s) - begin)) s; files in $out"
