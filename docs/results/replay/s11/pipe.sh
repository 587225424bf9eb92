#!/bin/bash
# pipe.sh SRC P TAG : copy job SRC (hardlinks), plan --representative at P, slice runs, durations, calibrate
SRC=$1; P=$2; TAG=$3; J=/tmp/rp/$TAG
cd /work/wt/replay
rm -rf $J; mkdir -p $J; cp -al $SRC/raw $SRC/payloads $SRC/graph $J/ 2>/dev/null; cp -a $SRC/*.json $J/ 2>/dev/null
py=.venv/bin/python
{
$py -m prism.slices.plan --job $J --devices $P --representative &&
/usr/bin/time -f "slices wall %e s user %U sys %S" $py -m prism.slices.run --job $J --all &&
$py -m prism.calibrate.from_slices --job $J &&
$py -m prism.cli calibrate --job $J --durations $J/slices/durations.parquet --transfers $J/slices/transfers.parquet
echo "rc $?"
} > $J.log 2>&1
