#!/usr/bin/env bash
# PrismTrace's overhead with the host's speed level cancelled (issue 21 item 6), in one device call: PrismTrace
# switched off and on inside one real-mode process by blocks of steps (`prism bench overhead --interleave`: the
# markers' hooks taken out of torch's hook dicts and put back, the groups' recorder detached), each on block against
# the off blocks either side. Session 15: the host's level moved within runs (~80 or ~100-130 ms a step, changing
# every several steps), so the per-process rounds of overhead_levels.sh could not resolve 3 % of a launch-bound step.
#   ref-b1: the reference workload (`--microbatches 4`, launch-bound), W=1, pinned to the last core, on and off
#           every step (REF_STEPS, 601; session 16 ran 801);
#   ref-b4: the same, blocks of 4 steps (only when REF4_STEPS is given; session 16 ran 321): a cost that leaks from
#           an on step into the next off step (garbage, deferred work) shows as a difference between the two;
#   gpu-bound: WORKLOAD_GPU (session 15's, ~1.2 s of fp32 matmuls a step), every step (GPU_STEPS, 25).
#   STAGES: the stages to run, comma-separated (default all; session 17's first call left gpu-bound 54 s, it timed
#   out: it needs ~80 s, model set-up included).
#   Session 17 (where the launch-bound cost goes): cuts-micro first (scripts/recorder_cuts_cost.py --device cuda:
#   each recorder cut's call before/after, ~10 s), then ref-ablate after ref-b1: the reference workload with
#   `--ablate ABLATE` (default uncut,memory,events,markers,bwd; ABLATE_STEPS, 1201: ~100 pairs a state): a
#   DIAGNOSTIC table, each part of PrismTrace taken away in its own on blocks of the same run (`uncut`: the recorder
#   without session 17's cuts, so before/after in one process).
#   A sampler (scripts/host_sampler.py: the last core's clock, busy, irq, steal every 0.5 s) and nvidia-smi's
#   clocks/utilisation run alongside, the bench's lines stamped with the unix second to join with them.
# Usage (the device, from the repository root; PKGS: the wheels prism's deps come from, default .whl):
#   bash scripts/overhead_interleave.sh $OUT 290
#   DEVICE=cpu PYTHON=.venv/bin/python REF_STEPS=25 ABLATE_STEPS=45 GPU_STEPS=9 WORKLOAD_GPU="--microbatches 1" \
#       MICRO_REPS=30 bash scripts/overhead_interleave.sh /tmp/ilv 280      (here, on CPU: ~1 min)
# Files: OUT/bench.txt (the tables), OUT/host.txt, OUT/log.txt, OUT/interleave.tgz (the stamped logs, samples.tsv,
# gpu.csv). Expected on the H200: ~265 s with BUDGET_S 290 (session 16's three stages took 180 s). Each stage starts
# only when its budget is left of BUDGET_S, and `timeout` stops it at what is left: the call ends within BUDGET_S + ~15 s.
set -uo pipefail
begin=$(date +%s)
out=${1:?usage: overhead_interleave.sh OUT BUDGET_S} total=${2:-280}
py=${PYTHON:-python3} device=${DEVICE:-cuda}
mkdir -p "$out"
work=$(mktemp -d /tmp/prism-ilv-XXXX)
log=$out/log.txt
source scripts/device_site.sh
gpu_host overhead_interleave "$py" "$log" "$device" || exit 2  # scripts/device_site.sh
last=$($py -c "import os; print(max(os.sched_getaffinity(0)))")
{ date -u; nproc; lscpu 2>&1 | head -n 30; echo "affinity: $(taskset -pc $$ 2>&1)"
  echo "core $last siblings: $(cat /sys/devices/system/cpu/cpu$last/topology/thread_siblings_list 2>/dev/null || echo '?')"
  command -v nvidia-smi > /dev/null && nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -n 60
  $py -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  git log -1 --format='prism %h %s' 2>/dev/null; } > "$out/host.txt" 2>&1

start_samplers "$py" "$last" "$device"  # scripts/device_site.sh

STAGE_STAMP=1 STAGE_SLACK=8  # stage (scripts/device_site.sh): lines stamped to join with the samples
bench=($py -m prism.cli bench overhead --interleave --device "$device" --nproc 1 --cores "$last")
ref=${WORKLOAD:---microbatches 4}
want() { [[ ",${STAGES:-cuts-micro,ref-b1,ref-ablate,ref-b4,gpu-bound}," == *",$1,"* ]]; }  # STAGES: a subset
want cuts-micro && stage cuts-micro 250 timeout 60 taskset -c "$last" $py scripts/recorder_cuts_cost.py --device "$device" --reps "${MICRO_REPS:-300}"
want ref-b1 && stage ref-b1 90 "${bench[@]}" --steps "${REF_STEPS:-601}" --block 1 --goal 3 "--workload=$ref"
want ref-ablate && stage ref-ablate 135 "${bench[@]}" --steps "${ABLATE_STEPS:-1201}" --block 1 \
    --ablate "${ABLATE:-uncut,memory,events,markers,bwd}" "--workload=$ref"
[ -n "${REF4_STEPS:-}" ] && want ref-b4 && stage ref-b4 50 "${bench[@]}" --steps "$REF4_STEPS" --block 4 --goal 3 "--workload=$ref"
want gpu-bound && stage gpu-bound 80 "${bench[@]}" --steps "${GPU_STEPS:-25}" --block 1 --goal 1 \
    "--workload=${WORKLOAD_GPU:-$GPU_BOUND_WORKLOAD}"
stop_samplers
for b in cuts-micro ref-b1 ref-ablate ref-b4 gpu-bound; do
    [ -f "$work/$b.log" ] || continue
    echo "== $b"
    if [ "$b" = cuts-micro ]; then cut -d' ' -f2- "$work/$b.log"; continue; fi
    sed -n '/prism bench overhead --interleave:/,$p' "$work/$b.log" | cut -d' ' -f2-
done > "$out/bench.txt"
cat "$out/bench.txt"
cp "$log" "$work/"
tar czf "$out/interleave.tgz" -C "$work" . && rm -rf "$work"
echo "overhead_interleave: done in $(($(date +%s) - begin)) s; files in $out"
