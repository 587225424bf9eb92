#!/bin/bash
# capture the weak layout at W on P=2
W=$1; DP=$((W/4))
cd /work/wt/replay
/usr/bin/time -v .venv/bin/python -m prism.cli launch --nproc $W --mode capture --devices 2 --out /tmp/rp/w$W --force \
  --preload prism.workloads.moe_gpt -m prism.workloads.moe_gpt --tp 2 --pp 2 --dp $DP --ep 2 --steps 3 --microbatches 2 \
  --micro-batch-size 1 --seq-len 16 --hidden 32 --ffn-hidden 32 --heads 2 --kv-heads 2 --layers 2 --experts 2 --topk 1 --vocab 64 \
  > /tmp/rp/cap$W.log 2>&1 && .venv/bin/python -m prism.cli graph --job /tmp/rp/w$W >> /tmp/rp/cap$W.log 2>&1
echo "rc $?" >> /tmp/rp/cap$W.log
