#!/bin/bash
# emulate the tp2pp4-mb4 job (P=2 calibration) with a sandbox of two pipeline stages (4: stage 2, 6: stage 3),
# before (main's emulation) and after (c6c2ab5), interleaved
J=/tmp/sbx/W/tp2pp4-mb4
for i in 1 2 3; do
  for v in before after; do
    T=/tmp/sbx/$v; [ $v = before ] && T=/tmp/sbx/base
    (cd $T && PYTHONPATH=$T /work/wt/sbx/.venv/bin/python -m prism.cli emulate --job $J --sandbox 4,6 --devices 2 --force) >> /tmp/sbx/two_stage.log 2>&1
    mv $J/emulation $J/s46_${v}$i
  done
done
