#!/usr/bin/env bash
# Why PrismTrace costs +54 % a step on the H200 (issue 21 item 6), in one device call:
#   1. scripts/overhead_profile.py: the reference workload (`--microbatches 4`, W=1 pinned, STEPS=15) with no
#      recording and with PrismTrace (PRISM_DEVICE=$DEVICE): timed without a profiler (PrismTrace also without
#      its markers, with its CPU clock, without the CUDA events, and with the memory probe before a82c40d; each
#      rank thread's CPU time and context switches), under cProfile of the rank and under torch.profiler (CPU +
#      CUDA, 3 steps): per-step call counts and times of prism's functions, the CUDA runtime calls that wait or
#      copy (cudaEventSynchronize, cudaStreamSynchronize, cudaDeviceSynchronize, cudaMemcpy...)
#   2. `prism bench overhead --device $DEVICE --nproc 1`, the larger workload (`--hidden 1024 --layers 8
#      --seq-len 512`), then the reference one, one interleaved round each
# Usage (the device, from the repository root; PKGS: the wheels prism's deps come from, default .whl):
#   bash scripts/overhead_profile.sh $OUT 240
#   DEVICE=cpu PYTHON=.venv/bin/python bash scripts/overhead_profile.sh /tmp/ovh 240   (here, on CPU)
# The device tool returns at most 8 files: OUT/summary.txt (the profile's main tables), OUT/bench.txt (the
# bench's tables), OUT/host.txt, OUT/log.txt, and OUT/results.tgz with every table (steps.tsv, syncs.tsv, threads.tsv,
# <variant>-cprofile-{tottime,cumtime}.txt, <variant>-prism-calls.tsv, <variant>-torch-ops.{txt,tsv},
# <variant>-torch-trace.json.gz, the bench logs). Each stage is started only when its budget is left of
# BUDGET_S and `timeout` stops it at what is left: the call ends within BUDGET_S + ~15 s.
set -uo pipefail
begin=$(date +%s)
out=${1:?usage: overhead_profile.sh OUT BUDGET_S} total=${2:-240}
py=${PYTHON:-python3} device=${DEVICE:-cuda} steps=${STEPS:-15}
mkdir -p "$out"
work=$(mktemp -d /tmp/prism-ovh-XXXX)
log=$out/log.txt
source scripts/device_site.sh
gpu_host overhead_profile "$py" "$log" "$device" || exit 2  # scripts/device_site.sh
{ date -u; nproc; free -g | head -2; command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version \
    --format=csv,noheader
  $py -c "import sys, torch, pyarrow; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.cuda.is_available(), 'pyarrow', pyarrow.__version__)"
  git log -1 --format='prism %h %s' 2>/dev/null; } > "$out/host.txt" 2>&1
cat "$out/host.txt"

# stage NAME NEEDED_S COMMAND...: scripts/device_site.sh
stage profile 120 $py scripts/overhead_profile.py "$work/profile" --device "$device" --steps "$steps" \
    --torch-steps 3 --workload "--microbatches 4"
cp "$work/profile/summary.txt" "$out/summary.txt" 2>/dev/null || tail -n 40 "$work/profile.log" > "$out/summary.txt"
# the larger workload first: the profile's plain runs already time the reference one the bench's way
stage bench-larger 60 $py -m prism.cli bench overhead --device "$device" --nproc 1 --steps "${BIG_STEPS:-8}" --repeats 1 \
    "--workload=--microbatches 4 --hidden 1024 --layers 8 --seq-len 512"
stage bench-reference 50 $py -m prism.cli bench overhead --device "$device" --nproc 1 --steps "$steps" --repeats 1 \
    "--workload=--microbatches 4"
for b in bench-larger bench-reference; do
    [ -f "$work/$b.log" ] && { echo "== $b"; grep -v -e "^step=" -e "grad_norm=" -e "^USDT" -e "^moe_gpt: rank" "$work/$b.log" | tail -n 12; }
done > "$out/bench.txt"
cat "$out/summary.txt" "$out/bench.txt" | head -n 120
cp "$log" "$work/"
tar czf "$out/results.tgz" -C "$work" . && rm -rf "$work"
echo "overhead_profile: done in $(($(date +%s) - begin)) s; files in $out"
