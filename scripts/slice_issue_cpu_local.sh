#!/usr/bin/env bash
# A slice rank's op issue cost against a real rank's, on this machine: W=2 tp2 (the reference workload, the
# fidelity bench's model), one real run (`prism launch --mode real --pin`) and one slice run holding both ranks
# (capture on P=2, plan on 2 devices: no replay server member), then scripts/fidelity_issue_cpu.py on the two.
#   bash scripts/slice_issue_cpu_local.sh OUT_DIR [ROUNDS]
set -euo pipefail
out=$1 rounds=${2:-1}
py=${PYTHON:-.venv/bin/python}
args=(-m prism.workloads.moe_gpt --tp 2 --steps 8 --hidden 128 --ffn-hidden 256 --seq-len 64 --layers 4 --heads 4
      --kv-heads 2 --experts 4 --micro-batch-size 2 --device cpu)
for r in $(seq 1 "$rounds"); do
    d=$out/round$r
    rm -rf "$d"; mkdir -p "$d"
    $py -m prism.cli launch --nproc 2 --mode real --pin --out "$d/truth0" "${args[@]}" > "$d/log.txt" 2>&1
    $py -m prism.cli graph --job "$d/truth0" >> "$d/log.txt" 2>&1
    $py -m prism.cli launch --nproc 2 --mode capture --devices 2 --out "$d/prism0/capture" "${args[@]}" >> "$d/log.txt" 2>&1
    $py -m prism.cli graph --job "$d/prism0" --raw "$d/prism0/capture/raw" --out "$d/prism0/graph" >> "$d/log.txt" 2>&1
    $py -m prism.slices.plan --job "$d/prism0" --devices 2 >> "$d/log.txt" 2>&1
    $py -m prism.slices.run --job "$d/prism0" --slice 0 >> "$d/log.txt" 2>&1
    echo "== round $r ($(git rev-parse --short HEAD))"
    $py scripts/fidelity_issue_cpu.py "$d"
done
