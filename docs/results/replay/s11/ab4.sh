#!/bin/bash
# ab4.sh JOB REPEATS : eager gloo (TORCH_GLOO_LAZY_INIT=0); the server's members on one shared gloo device (SHARED=1) vs a device each
J=$1; R=$2
cd /work/wt/replay; py=.venv/bin/python
for i in $(seq 1 $R); do for n in 0 1; do
  echo "== repeat $i shared $n $(uptime)"
  PRISM_TRY_SHARED=$n TORCH_GLOO_LAZY_INIT=0 $py -m prism.slices.run --job $J --all 2>&1 | grep "replay server's ops\|virtual): [0-9]* ops\|failed" | grep -v "(1 virtual)" | sed 's/.*(replay_ops.parquet); //'
  $py -m prism.calibrate.from_slices --job $J >/dev/null && $py -m prism.cli calibrate --job $J --durations $J/slices/durations.parquet --transfers $J/slices/transfers.parquet 2>&1 | grep -o "median [0-9.]*"
  $py /tmp/rp/kinds.py $J | grep -o "('dp'[^)]*)\|('edp'[^)]*)" | tr '\n' ' '; echo
done; done
