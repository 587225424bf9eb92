#!/bin/bash
# fidelity_terms on a local W=8 dp8-var run, slices timed with the results loaded during (0) / before (1024) the run
set -e
cd /work/wt/fidelity
J=/tmp/fid/dp8var-p2
ARGS=$(.venv/bin/python -c "from prism.bench.fidelity import BY_NAME, MODEL; print(' '.join(BY_NAME['dp8-var'].args(8, MODEL)))")
C=/tmp/fid/terms
mkdir -p $C
if [ ! -d $C/truth/graph ]; then
  .venv/bin/prism launch --nproc 8 --mode real --pin --out $C/truth -m prism.workloads.moe_gpt $ARGS > $C/truth.log 2>&1
  .venv/bin/prism graph --job $C/truth >> $C/truth.log 2>&1
fi
for MB in 0 1024; do
  D=$C/preload$MB
  rm -rf $D; mkdir -p $D/prism0
  ln -s $C/truth $D/truth0
  for x in capture graph slices; do ln -s $J/$x $D/prism0/$x; done; cp -r $J/calibrated $D/prism0/
  for k in $(.venv/bin/python -c "import pyarrow.parquet as pq; t=pq.read_table('$J/slices/plan.parquet').to_pylist(); print(' '.join(sorted({str(r['slice']) for r in t if r['measured']})))"); do
    PRISM_SLICE_PRELOAD_MB=$MB .venv/bin/python -m prism.slices.run --job $D/prism0 --slice $k --timed-by $D/prism0/calibrated/timeline.parquet >> $D/log.txt 2>&1
  done
  .venv/bin/python -m prism.calibrate.from_slices --job $D/prism0 --slices slices_timed >> $D/log.txt 2>&1
done
.venv/bin/python -m prism.bench.fidelity_terms $C/preload0 $C/preload1024
