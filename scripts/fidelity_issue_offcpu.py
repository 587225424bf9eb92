"""The time an op's issue span spends off the CPU (its wall span minus its CPU time), a slice run's against
truth0's on the same (rank, seq), per op and group (iterations >= 1): the median and p95 in us, how many exceed
1 ms, and the sum in ms per rank-iteration. Analysis only (docs/fidelity.md, session 17).

    python scripts/fidelity_issue_offcpu.py CONFIG_DIR [CONFIG_DIR ...]   # dirs with truth0/graph and prism0/slices
"""
import sys, glob
import polars as pl
from pathlib import Path
for d in sys.argv[1:]:
    d = Path(d)
    cols = ["rank","seq","kind","op","group_name","is_async","iteration","t_start_ns","t_end_ns","cpu_ns"]
    tr = pl.read_parquet(d/"truth0/graph/events.parquet", columns=cols)
    sl = pl.concat([pl.read_parquet(p, columns=cols) for p in sorted(glob.glob(str(d/"prism0/slices/slice=*/events.parquet")))])
    g = pl.read_parquet(d/"prism0/graph/groups.parquet").select("group_name","group_desc","size")
    m = sl.join(tr, on=["rank","seq"], suffix="_t").filter((pl.col("iteration")>=1) & pl.col("kind").cast(pl.String).is_in(["collective","send","recv"]))
    m = m.with_columns(off=(pl.col("t_end_ns")-pl.col("t_start_ns")-pl.col("cpu_ns"))/1e3, off_t=(pl.col("t_end_ns_t")-pl.col("t_start_ns_t")-pl.col("cpu_ns_t"))/1e3,
                       group_name=pl.col("group_name").cast(pl.String)).join(g, on="group_name", how="left")
    nri = m.select(pl.struct("rank","iteration").n_unique()).item()
    out = m.group_by("op","group_desc","size","is_async").agg(n=pl.len(), off_med=pl.col("off").median(), off_t_med=pl.col("off_t").median(),
        off_p95=pl.col("off").quantile(0.95), off_t_p95=pl.col("off_t").quantile(0.95), n_big=(pl.col("off")>1000).sum(), n_big_t=(pl.col("off_t")>1000).sum(),
        ms_it=pl.col("off").sum()/1e3/nri, ms_it_t=pl.col("off_t").sum()/1e3/nri).sort("ms_it", descending=True)
    print(d.name)
    with pl.Config(tbl_rows=20, tbl_width_chars=250, tbl_cols=20):
        print(out)
