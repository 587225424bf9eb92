#!/usr/bin/env bash
# Session 17 (issue 24): the neighbours ring's service time against gloo's own all-reduce, locally (2 cores,
# shared with two other helpers). Each round runs gloo (4 processes), ring16 (the ring with session 16's steps)
# and ring (this branch's), one after the other; rows in $D/*.jsonl, tables in $D/tables.txt.
set -u
PY=${PY:-.venv/bin/python}
D=${D:-docs/results/fidelity/s17/ring}
R="$PY scripts/replay_ring.py --members 4 --layouts gloo,ring16,ring --repeats 3"
run() { local name=$1; shift; echo "\$ $R $* --out $D/$name.jsonl" >> $D/commands.txt; $R "$@" --out $D/$name.jsonl > /dev/null; }
: > $D/commands.txt
# A: the brief's layout (dp16-ep4's EDP group in a slice: positions 0,1 real, 2,3 the server's), 256 KB bursts of 20
run A-live01-256k-burst20 --burst 20 --bursts 20 --live 0,1 --bytes 262144 --cores 0,1 --gloo-cores 0,1 --server-cores 1
# B: the same group with the slice ranks at 0 and 2, so no two ring neighbours share one of the 2 cores (in A
#    slice rank 1 and the server do; gloo's 4 alternate)
run B-live02-256k-burst20 --burst 20 --bursts 20 --live 0,2 --bytes 262144 --cores 0 --gloo-cores 0,1 --server-cores 1
# C, D: one op at a time (the hop's latency, not the cores' throughput), 256 KB and 4 KB
run C-live02-256k-burst1 --burst 1 --bursts 100 --live 0,2 --bytes 262144 --cores 0 --gloo-cores 0,1 --server-cores 1
run D-live02-4k-burst1 --burst 1 --bursts 300 --live 0,2 --bytes 4096 --cores 0 --gloo-cores 0,1 --server-cores 1
$PY scripts/replay_ring.py --table-from $D/A-*.jsonl $D/B-*.jsonl $D/C-*.jsonl $D/D-*.jsonl > $D/tables.txt
uptime >> $D/tables.txt
