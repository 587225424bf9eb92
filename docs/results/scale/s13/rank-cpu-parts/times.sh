#!/bin/bash
# times.sh W OUT
W=$1; OUT=$2; cd "$(git rev-parse --show-toplevel)"; mkdir -p $OUT; rm -f $OUT/times.tsv  # appended by every rank
ARGS=$(.venv/bin/python -c "from prism.bench.capture_scale import layout_args; from prism.bench.scale_slices import WEAK; print(' '.join(layout_args(*WEAK[$W], 2)[2:]))")
.venv/bin/prism launch --nproc $W --mode capture --devices 2 --out $OUT/job --force --preload prism.workloads.moe_gpt scripts/profile_rank.py $OUT times prism.workloads.moe_gpt $ARGS > $OUT/log 2>&1
echo rc=$? >> $OUT/log
