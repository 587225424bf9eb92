#!/usr/bin/env bash
# DeepSpeed 0.19.8 on CPU (gloo), unmodified, through prism: examples/deepspeed/train.py with DeepSpeed's ZeRO
# engine (its own optimizer wrapper) and its pipeline engine (its own schedule), for each layout torchrun vs
# prism launch --mode real vs capture (P=1, and P=2 at W=4), the graph's iteration and microbatch counts, and
# the emulation of one sandbox rank; the losses side by side, "same" when equal as printed (10 digits).
# DeepSpeed is NOT a prism dependency: it goes into its own venv VENV, outside the repository, which sees this
# checkout's .venv (torch 2.13.0+cpu, prism) through a .pth file:
#   python -m venv VENV; pip install deepspeed==0.19.8 (its dependencies pinned below; torch is the checkout's)
# The first run JIT-builds DeepSpeed's CPU shm op (minutes; cached under ~/.cache/torch_extensions). It is used
# only by DeepSpeed's inference all-reduce, and only when LOCAL_SIZE is set (DeepSpeed's launcher; torchrun
# and prism do not set it): the training below talks through torch.distributed only.
# Usage: scripts/frameworks/deepspeed_cpu.sh VENV WORK_DIR   (log: docs/results/frameworks/deepspeed_cpu.txt)
set -u
VENV=$(realpath -m "$1"); WORK=$(realpath -m "$2"); REPO=$(cd "$(dirname "$0")/../.." && pwd)
LOG=$REPO/docs/results/frameworks/deepspeed_cpu.txt; mkdir -p "$WORK" "$(dirname "$LOG")"
case "$VENV" in "$REPO"/*) echo "VENV must be outside the repository" >&2; exit 2;; esac
if [ ! -x "$VENV/bin/python" ]; then
    "$REPO/.venv/bin/python" -m venv "$VENV" || exit 1
    SITE=$("$REPO/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    MINE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$SITE')" > "$MINE/prism_venv.pth"
    "$VENV/bin/pip" install -q deepspeed==0.19.8 -c <(printf '%s\n' torch==2.13.0 hjson==3.1.0 msgpack==1.2.4 \
        ninja==1.13.2 py-cpuinfo==9.0.0) || exit 1  # what it pulled in, as installed for the committed log
fi
PY=$VENV/bin/python
export OMP_NUM_THREADS=1
{ echo "# $(date -u +%FT%TZ) $($PY -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__)' 2>/dev/null | tail -1)"
  echo "# framework venv: $("$VENV/bin/pip" freeze 2>/dev/null | grep -iE '^(deepspeed|hjson|msgpack|ninja|py-cpuinfo|pydantic)=' | paste -sd' ')"
  echo "# $(nproc --all) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$LOG"
NOISE='leaked|nanobind|skipped remainder|refleaks'  # triton's exit-time warnings (installed for torchtitan)
losses() { grep -E '^step [0-9]+ rank [0-9]+ loss ' "$1" | sort; }
run() {  # name, command...: exit code, wall time, losses
    local name=$1; shift; local t0=$(date +%s.%N)
    (cd "$WORK" && "$@") > "$WORK/$name.log" 2>&1; local rc=$?
    echo "== $name: exit $rc, wall $(echo "$(date +%s.%N) - $t0" | bc | xargs printf '%.1f') s: ${*#$REPO/}" >> "$LOG"
    [ $rc -eq 0 ] || grep -vE "$NOISE" "$WORK/$name.log" | tail -4 | sed 's/^/   | /' >> "$LOG"
    return $rc
}
compare() {  # what, reference file, file: the same as printed, or the largest relative difference
    if [ -s "$3" ] && cmp -s "$2" "$3"; then echo "   $1: same losses ($(wc -l < "$3") lines)" >> "$LOG"; return; fi
    "$PY" - "$1" "$2" "$3" >> "$LOG" <<'PYTHON'
import sys
what, a, b = sys.argv[1:]
x, y = open(a).read().split("\n"), open(b).read().split("\n")
keys = lambda lines: [line.rsplit(" ", 1)[0] for line in lines if line]
if not x[0] or keys(x) != keys(y):
    print(f"   {what}: DIFFERENT lines ({len(keys(x))} vs {len(keys(y))})")
else:
    rel = max(abs(float(p.split()[-1]) - float(q.split()[-1])) / abs(float(p.split()[-1]))
              for p, q in zip(x, y) if p)
    n = sum(p != q for p, q in zip(x, y))
    print(f"   {what}: {n} of {len(keys(x))} losses differ as printed, at most {rel:.1e} relative "
          f"({'within' if rel < 1e-5 else 'BEYOND'} 1e-5: prism's reduction order is not gloo's beyond 2 members)")
PYTHON
}
layout() {  # tag, nproc, sandbox, program arguments...
    local tag=$1 n=$2 sandbox=$3; shift 3
    local prog=("$REPO/examples/deepspeed/train.py" "$@") J=$WORK/$tag
    echo "" >> "$LOG"; echo "### $tag: W=$n, train.py $*" >> "$LOG"
    rm -rf "$J"; mkdir -p "$J"
    run "$tag.torchrun" "$PY" -m torch.distributed.run --nproc-per-node "$n" --master-port $((29400 + RANDOM % 500)) \
        "${prog[@]}"
    losses "$WORK/$tag.torchrun.log" > "$J/torchrun.txt"; sed 's/^/   /' "$J/torchrun.txt" >> "$LOG"
    run "$tag.real" "$PY" -m prism.cli launch --nproc "$n" --mode real --out "$J/real" "${prog[@]}"
    losses "$WORK/$tag.real.log" > "$J/real.txt"; compare "real vs torchrun" "$J/torchrun.txt" "$J/real.txt"
    for p in 1 2; do
        [ "$p" -eq 1 ] || [ "$n" -ge 4 ] || continue  # P=2 only where it leaves ranks waiting
        run "$tag.capture_p$p" "$PY" -m prism.cli launch --nproc "$n" --mode capture --devices "$p" \
            --out "$J/p$p/capture" "${prog[@]}"
        losses "$WORK/$tag.capture_p$p.log" > "$J/capture_p$p.txt"
        compare "capture P=$p vs torchrun" "$J/torchrun.txt" "$J/capture_p$p.txt"
    done
    run "$tag.graph" "$PY" -m prism.cli graph --job "$J/p1" --raw "$J/p1/capture/raw" --out "$J/p1/graph"
    "$PY" -m prism.cli sql --job "$J/p1" "SELECT rank, iterations, iteration_rule, microbatch_rule FROM ranks \
        ORDER BY rank" 2>&1 | grep -vE "$NOISE" | sed 's/^/   /' >> "$LOG"
    "$PY" -m prism.cli sql --job "$J/p1" "SELECT op, min(n) AS min_per_rank, max(n) AS max_per_rank FROM (SELECT \
        rank, op, count(*) AS n FROM events WHERE kind = 'marker' GROUP BY ALL) GROUP BY op ORDER BY op" 2>&1 \
        | grep -vE "$NOISE" | sed 's/^/   /' >> "$LOG"
    run "$tag.emulate" "$PY" -m prism.cli launch --nproc "$n" --mode emulate --capture "$J/p1/capture" \
        --sandbox "$sandbox" --out "$J/emu" "${prog[@]}"
    losses "$WORK/$tag.emulate.log" > "$J/emulate.txt"
    grep -E "rank ($(echo "$sandbox" | tr , '|')) loss" "$J/capture_p1.txt" > "$J/capture_sandbox.txt"
    compare "emulate (sandbox $sandbox) vs capture" "$J/capture_sandbox.txt" "$J/emulate.txt"
}
layout zero2-w2 2 1 --engine zero --zero-stage 2
layout zero1-w4 4 2 --engine zero --zero-stage 1
layout pipe-w2 2 1 --engine pipe --pp 2
layout pipe2-dp2-w4 4 3 --engine pipe --pp 2
echo "" >> "$LOG"; echo "# done $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG"
