"""The CPU time (`cpu_ns`) of a slice run's events against truth0's on the same (rank, seq), per kind: compute,
markers, op issue (collective, send, recv spans), waits; iterations >= 1. Median of each side, their difference,
and the ratio of the sums (outliers included). Analysis only.

    python scripts/fidelity_issue_cpu.py CONFIG_DIR [CONFIG_DIR ...]   # dirs with truth0/graph and prism0/slices
"""
import sys, glob
import polars as pl
from pathlib import Path
print("| config | kind | n | issue CPU us slices | truth0 | diff us | ratio |")
print("|---|---|---|---|---|---|---|")
for d in sys.argv[1:]:
    d = Path(d)
    cols = ["rank","seq","kind","op","is_async","iteration","cpu_ns"]
    tr = pl.read_parquet(d/"truth0/graph/events.parquet", columns=cols)
    sl = pl.concat([pl.read_parquet(p, columns=cols) for p in sorted(glob.glob(str(d/"prism0/slices/slice=*/events.parquet")))])
    m = sl.join(tr, on=["rank","seq"], suffix="_t").filter(pl.col("iteration")>=1)
    m = m.with_columns(k=pl.when(pl.col("kind").cast(pl.String).is_in(["collective","send","recv"])).then(pl.lit("op issue")).otherwise(pl.col("kind").cast(pl.String)))
    out = m.group_by("k").agg(n=pl.len(), c=pl.col("cpu_ns").median()/1e3, ct=pl.col("cpu_ns_t").median()/1e3, s=pl.col("cpu_ns").sum(), st=pl.col("cpu_ns_t").sum()).sort("k")
    for r in out.iter_rows(named=True):
        print(f"| {d.name} | {r['k']} | {r['n']} | {r['c']:.1f} | {r['ct']:.1f} | {r['c']-r['ct']:+.1f} | {r['s']/r['st']:.3f} |")
