#!/usr/bin/env bash
# The ring micro on the 16-core host (~70 s): the dp16-ep4 slice run's layouts, the slice ranks on cores 0-7 and the
# replay server on 8-15 as in `prism slices run` (log.txt: "on cores [8, ..., 15]"), gloo's members one a core as
# the truth's --pin. Each round: gloo, ring16 (session 16's steps), ring (this branch's), one after the other.
#   bash docs/results/fidelity/s17/ring/host.sh $OUT        (python3: PY=...)
set -u
OUT=${1:?usage: host.sh OUT}
PY=${PY:-python3}
R="$PY scripts/replay_ring.py --burst 20 --bursts 40 --layouts gloo,ring16,ring --table"
# EDP group of dp16-ep4 (4 members: 2 in the slice, 2 the server's), 256 KB
$R --repeats 3 --members 4 --live 0,1 --bytes 262144 --cores 0,1 --gloo-cores 0-3 --server-cores 8-15 --out $OUT/ring-edp.jsonl
# DP16 group (8 + 8), 131 KB
$R --repeats 2 --members 16 --live 0-7 --bytes 131072 --cores 0-7 --gloo-cores 0-15 --server-cores 8-15 --out $OUT/ring-dp16.jsonl
# the server's op hand-off (main thread -> pool) taken out: an experiment, not the runtime
$PY scripts/replay_ring.py --burst 20 --bursts 40 --layouts gloo,ring --server-queue --table --repeats 2 --members 4 \
    --live 0,1 --bytes 262144 --cores 0,1 --gloo-cores 0-3 --server-cores 8-15 --out $OUT/ring-edp-queue.jsonl
