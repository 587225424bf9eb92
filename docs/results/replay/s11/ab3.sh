#!/bin/bash
# ab3.sh JOB REPEATS : slice runs + durations + calibrate, PRISM_REPLAY_SHARED_DEVICE 0 vs 1 (interleaved)
J=$1; R=$2
cd /work/wt/replay; py=.venv/bin/python
for i in $(seq 1 $R); do for n in 0 1; do
  echo "== repeat $i shared_device $n $(uptime)"
  PRISM_REPLAY_SHARED_DEVICE=$n $py -m prism.slices.run --job $J --all 2>&1 | grep "replay server's ops\|virtual): [0-9]* ops" | grep -v "(1 virtual)" | sed 's/.*(replay_ops.parquet); //'
  $py -m prism.calibrate.from_slices --job $J >/dev/null && $py -m prism.cli calibrate --job $J --durations $J/slices/durations.parquet --transfers $J/slices/transfers.parquet 2>&1 | grep -o "median [0-9.]*"
  $py /tmp/rp/kinds.py $J | grep -o "('dp'[^)]*)\|('edp'[^)]*)" | tr '\n' ' '; echo
done; done
