#!/usr/bin/env bash
# Why torchtitan's slice runs and emulation hang on CUDA (issue 21 item 3; session 12's H200 call): one device
# call (<= 200 s on one H200) that runs torchtitan's patterns (tests/programs/titan_cuda_patterns.py, W=4 FSDP2
# ranks on the one GPU) through capture -> graph -> slice plan -> slice runs -> emulate, each step with a short
# hang timeout (PRISM_HANG_TIMEOUT=20). It checks this branch's two fixes on the device (slices: a group with a
# replayed member carries CUDA tensors over gloo, not the NCCL the program asked for; emulate: the CUDA fold
# kernel built before the program runs, and the group thread ordered after the caller's CUDA stream) and
# measures the emulate cause's one figure (the kernel's build time, against the 20/60 s hang timeouts):
#   lane nccl        (the program asks for "nccl", as torchtitan does): capture, graph, plan, every slice, emulate
#                    sandbox 1 (the fold kernel already built: lane B's folder);
#   lane nccl_cold   the same capture and emulate only, with an EMPTY fold-kernel build folder (built in the
#                    run, as in session 12's call: now before the program, `fold_cuda.build_before_run`);
#   lane gloo        (the same program asking for "gloo", as the reference workload's CUDA tests do): as nccl;
#   lane nccl_devid  ("nccl" and init_process_group(device_id=cuda:0): eager init, bound device): as nccl;
#   lane B  the CUDA fold kernel (prism/runtime/emulate/fold_cuda.py) built once into an empty folder, timed;
#   lane T  pytest tests/gpu/test_stream_order_cuda.py (the emulate group thread vs the caller's side stream, ~5 s),
#           then tests/gpu/test_slices_cuda.py tests/gpu/test_emulate_cuda.py (the reference path, for contrast).
# The lanes run at once (16 cores; the GPU is shared as capture shares it). A step still running
# 6 s before its cap gets SIGUSR1 in every process of its tree (prism's runs dump every thread's Python stack on
# it, `prism.runtime.launch.stall.enable_dumps`) and then is stopped; the stacks are in its log.
# Results (text, re-analysable offline): $OUT/results.tsv (step, exit, wall_s, note), $OUT/losses.tsv (step,
# rank, step number, hex loss), $OUT/compare.tsv (emulate vs capture, slices vs capture: equal or not),
# $OUT/env.txt, $OUT/logs.tgz (logs/NAME.log: every step's full log), $OUT/stacks.txt (the dumped stacks, by
# step): 6 files (the device tool returns at most 8).
# Carried: .whl (prism's wheels: polars, duckdb, jsonschema, ...); no torchtitan needed.
# Usage: scripts/frameworks/cuda_hang_probe.sh OUT [BUDGET_S]   (from the repository root; default 200)
#   DEVICE=cpu  lanes nccl and gloo on a CPU-only torch (gloo), one after the other; the others skipped (the
#               local check; on this 2-core box a pinned run may wait for cores other users' runs hold:
#               slices run with --no-pin there, and every cap is CAP_SCALE=3 times the device's)
#   PY=python   the interpreter (default python3)
set -u
OUT=$(realpath -m "${1:?usage: cuda_hang_probe.sh OUT [BUDGET_S]}"); BUDGET=${2:-200}
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO" || exit 2
DEVICE=${DEVICE:-cuda}; PY=${PY:-python3}; T0=$(date +%s)
WORK=$(mktemp -d /tmp/cuda-probe-XXXX)
LOGS=$WORK/logs; mkdir -p "$OUT" "$LOGS"  # the logs come back packed: $OUT/logs.tgz (the device returns 8 files)
TSV=$OUT/results.tsv; LOSSES=$OUT/losses.tsv; CMP=$OUT/compare.tsv
printf 'step\texit\twall_s\tnote\n' > "$TSV"; printf 'step\trank\tstep_no\tloss_hex\n' > "$LOSSES"
printf 'what\tresult\n' > "$CMP"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PRISM_HANG_TIMEOUT=${HANG:-20} PRISM_STALL_TIMEOUT=0
if [ "$DEVICE" = cuda ]; then
  . scripts/device_site.sh
  [ -d .whl ] || { echo "cuda_hang_probe.sh: .whl missing (carry it)"; exit 2; }
  install_site .whl "$PY" || { echo "cuda_hang_probe.sh: installing .whl failed"; exit 2; }
  export CUDA_VISIBLE_DEVICES=0 PRISM_DEVICE=cuda  # install_site empties CUDA_VISIBLE_DEVICES
  ulimit -n "$(ulimit -Hn)"
  PROG_DEV=(--device cuda --gpus 1); SLICE_OPTS=(); CAP_SCALE=${CAP_SCALE:-1}
else
  export OMP_NUM_THREADS=1 PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  PROG_DEV=(--device cpu)
  SLICE_OPTS=(--no-pin)  # this box is shared: pinned slice ranks wait for cores other users' runs hold
  CAP_SCALE=${CAP_SCALE:-3}  # and its 2 cores are loaded: each step's cap x3 (the dump check's too)
fi
{ date -u; echo "DEVICE=$DEVICE BUDGET=$BUDGET HANG=$PRISM_HANG_TIMEOUT commit $(git rev-parse HEAD 2>/dev/null)"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.version.cuda)'
  command -v nvcc ninja; nproc; [ "$DEVICE" = cuda ] && nvidia-smi -L; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
PROG=(tests/programs/titan_cuda_patterns.py "${PROG_DEV[@]}" --steps 2)
left() { echo $(( BUDGET - ($(date +%s) - T0) - 8 )); }  # 8 s kept for the tables

tree_pids() {  # ROOT: ROOT and every process under it
  local p=$1 c; echo "$p"
  for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do tree_pids "$c"; done
}
catches_usr1() {  # PID: whether it has a handler for SIGUSR1 (bit 10 of SigCgt in /proc/PID/status)
  local m; m=$(awk '/^SigCgt/ {print $2}' "/proc/$1/status" 2>/dev/null); [ -n "$m" ] && (( 0x$m & 0x200 ))
}
step() {  # name cap_s command...: time-boxed; on overrun the tree's Python stacks, then stopped; a table row
  local name=$1 cap=$(( $2 * CAP_SCALE )); shift 2; local t; t=$(left); [ "$t" -lt "$cap" ] && cap=$t
  local log=$LOGS/$name.log
  if [ "$cap" -le 8 ]; then printf '%s\tskip\t0\tno budget left\n' "$name" >> "$TSV"; return 1; fi
  echo "== $name (cap ${cap}s): $*"
  local t0; t0=$(date +%s.%N)
  setsid "$@" > "$log" 2>&1 &
  local pid=$! waited=0 note=""
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $(( (cap - 6) * 10 )) ]; do sleep 0.1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then  # overran: every process's Python stacks, then stop the tree
    note="overran ${cap}s: stacks dumped"
    local pids; pids=$(tree_pids "$pid")
    { echo "### $name: process tree at $(( $(date +%s) - T0 )) s"; ps -o pid,ppid,stat,wchan:32,etime,args -p "$(echo $pids | tr ' ' ,)"; } \
      >> "$OUT/stacks.txt" 2>&1
    # only the processes that catch SIGUSR1 (prism's zygote, ranks, replay: faulthandler); the others (the
    # launchers, which relay the output) would die of it
    local p; for p in $pids; do catches_usr1 "$p" && kill -USR1 "$p" 2>/dev/null; done; sleep 3
    kill -TERM -- -"$pid" 2>/dev/null; sleep 2; kill -KILL -- -"$pid" 2>/dev/null
  fi
  wait "$pid"; local rc=$?; local t1; t1=$(date +%s.%N)
  if grep -q "Current thread\|^Thread 0x" "$log"; then
    { echo "### $name: stacks in its log"; grep -n -A40 "Current thread\|^Thread 0x" "$log" | head -400; } >> "$OUT/stacks.txt"
  fi
  [ -z "$note" ] && [ "$rc" -ne 0 ] && note=$(grep -E "run stopped|Error|error:|refuse|hang" "$log" | tail -1 | cut -c1-240 | tr '\t' ' ')
  grep -o "^result loss [0-9]* [0-9]* [-0-9a-fx.p+]*" "$log" | awk -v s="$name" '{print s "\t" $3 "\t" $4 "\t" $5}' \
    | sort -u >> "$LOSSES"
  printf '%s\t%s\t%.1f\t%s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$note" >> "$TSV"
  echo "   $name: exit $rc $note"
  return "$rc"
}
same() {  # what step ref [rank]: step's (rank, step, loss) rows against ref's for the same ranks (or `rank`)
  local a b
  a=$(awk -F'\t' -v s="$2" -v r="${4:-}" '$1 == s && (r == "" || $2 == r) {print $2, $3, $4}' "$LOSSES" | sort)
  b=$(awk -F'\t' -v s="$3" -v r="${4:-}" 'NR == FNR { if ($1 == s2) want[$2] = 1; next }
        $1 == s && (r == "" ? ($2 in want) : $2 == r) {print $2, $3, $4}' s2="$2" "$LOSSES" "$LOSSES" | sort)
  local v="equal, bitwise ($(echo "$a" | grep -c .) losses)"
  if [ -z "$a" ]; then v="no losses in $2"; elif [ "$a" != "$b" ]; then v="DIFFER: $2 [$(echo $a)] vs $3 [$(echo $b)]"; fi
  printf '%s\t%s\n' "$1" "$v" >> "$CMP"
}

lane() {  # tag build stages program-args...: capture [-> graph -> plan -> every slice] -> emulate (sandbox 1)
  # build: the fold kernel's folder for the emulation: "cold" (empty: built inside the run, as on a new host)
  # or "warm" (lane B's, once it finished); stages: "all", or "emulate" (capture and emulate only)
  local tag=$1 build=$2 stages=$3; shift 3; local J=$WORK/$tag
  step "capture_$tag" 60 "$PY" -m prism.cli launch --nproc 4 --mode capture --devices 2 --out "$J/capture" \
      "${PROG[@]}" "$@" || return
  [ "$stages" = all ] && slices "$tag" "$J"
  local cap=60
  if [ "$build" = warm ]; then
    local w=0; while [ "$DEVICE" = cuda ] && [ ! -e "$WORK/fold-built" ] && [ "$(left)" -gt 40 ] && [ "$w" -lt 1200 ]; do sleep 0.1; w=$((w+1)); done
    build=$WORK/fold-warm
  else
    build=$WORK/fold-$tag; cap=170  # the build (~a minute?) runs before the program, inside this step
  fi
  PRISM_CUDA_BUILD_DIR=$build step "emulate_$tag" "$cap" "$PY" -m prism.cli launch --nproc 4 --mode emulate \
      --capture "$J/capture" --sandbox 1 --out "$J/emu" --force "${PROG[@]}" "$@"
  same "emulate_$tag (sandbox 1, fold kernel $(basename "$build")) = capture_$tag rank 1" "emulate_$tag" "capture_$tag" 1
}

slices() {  # tag job: graph -> plan -> every slice, each compared with the capture
  local tag=$1 J=$2
  step "graph_$tag" 40 "$PY" -m prism.cli graph --job "$J" --raw "$J/capture/raw" --out "$J/graph" \
    && step "plan_$tag" 30 "$PY" -m prism.slices.plan --job "$J" --devices 2
  local k
  for k in $("$PY" -c 'import sys, pyarrow.parquet as pq; print(*sorted(set(pq.read_table(sys.argv[1])["slice"].to_pylist())))' \
             "$J/slices/plan.parquet" 2>/dev/null); do
    step "slice_${tag}_$k" 45 "$PY" -m prism.slices.run --job "$J" --slice "$k" ${SLICE_OPTS[@]+"${SLICE_OPTS[@]}"}
    same "slice_${tag}_$k = capture_$tag" "slice_${tag}_$k" "capture_$tag"
  done
}

dump_check() {  # the stack dump itself (a hang the watchdog does not stop: it is off for this step):
  # tests/programs/hang_skipped_collective.py in real mode must overrun and leave its ranks' stacks
  PRISM_HANG_TIMEOUT=0 step dump_check 14 "$PY" -m prism.cli launch --nproc 2 --mode real --out "$WORK/dump_check" \
      tests/programs/hang_skipped_collective.py
  local v="NO STACKS (the dump path is broken)"; grep -q "^### dump_check: stacks" "$OUT/stacks.txt" 2>/dev/null && v="stacks dumped"
  printf 'dump_check\t%s\n' "$v" >> "$CMP"
}

if [ "$DEVICE" = cuda ]; then  # 16 cores: every lane at once
  ( dump_check ) &
  # lane B: the fold kernel into an empty folder, timed (what the first CUDA fold cost inside a run before
  # fold_cuda.build_before_run: more than the hang timeout, and the watchdog stopped the run)
  ( PRISM_CUDA_BUILD_DIR=$WORK/fold-warm step fold_build 150 "$PY" -c \
      'import time; t = time.monotonic(); from prism.runtime.emulate import fold_cuda; fold_cuda.module(); print(f"fold kernel built in {time.monotonic() - t:.1f} s")' \
    ; touch "$WORK/fold-built" ) &
  # lane T: the stream-order test, then the reference workload's CUDA slices and emulation (session 6's tests),
  # the kernel from lane B
  ( PRISM_CUDA_BUILD_DIR=$WORK/fold-warm step pytest_gpu $(( BUDGET - 20 )) "$PY" -m pytest -p no:cacheprovider -v \
      --basetemp="$WORK/pt" -m gpu tests/gpu/test_stream_order_cuda.py tests/gpu/test_slices_cuda.py \
      tests/gpu/test_emulate_cuda.py ) &
  ( lane nccl warm all --backend nccl ) &                    # torchtitan's backend
  ( lane nccl_cold cold emulate --backend nccl ) &           # the kernel built in the run, as on a new host
  ( lane gloo warm all --backend gloo ) &                    # the reference workload's backend
  ( lane nccl_devid warm all --backend nccl --device-id ) &  # + init_process_group(device_id=...): eager init
else  # 2 cores: one after the other (each run claims the cores it pins to); no CUDA kernel, no device_id on CPU
  dump_check; lane nccl cold all --backend nccl; lane gloo warm all --backend gloo
fi
wait

echo "== results ($TSV)"; column -t -s $'\t' "$TSV" 2>/dev/null || cat "$TSV"
echo "== comparisons ($CMP)"; column -t -s $'\t' "$CMP" 2>/dev/null || cat "$CMP"
grep -h "fold kernel built in" "$LOGS/fold_build.log" 2>/dev/null
[ -f "$LOGS/pytest_gpu.log" ] && { echo "== pytest_gpu"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$LOGS/pytest_gpu.log" | tail -12; }
for f in "$LOGS"/*.log; do grep -q "run stopped\|still waiting\|replay server failed" "$f" && { echo "== $(basename "$f")"; grep -A6 "run stopped\|still waiting\|replay server failed" "$f" | head -14; }; done
[ -s "$OUT/stacks.txt" ] && echo "== stacks: $OUT/stacks.txt ($(grep -c '^###' "$OUT/stacks.txt") dumps)"
tar -czf "$OUT/logs.tgz" -C "$WORK" logs
echo "# done in $(( $(date +%s) - T0 )) s"
