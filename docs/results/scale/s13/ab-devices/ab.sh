cd "$(git rev-parse --show-toplevel)"
mkdir -p "${OUT:-/tmp/ab}"  # OUT=DIR: where the four captures write (default /tmp/ab)
for i in 1 2; do
  for p in 1 2; do
    .venv/bin/python scripts/capture_phases.py --sizes 128 --devices $p --out ${OUT:-/tmp/ab}/ab-p$p-$i > ${OUT:-/tmp/ab}/ab-p$p-$i.log 2>&1
  done
done
echo done
