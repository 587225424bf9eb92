import sys, duckdb
for J in sys.argv[1:]:
    print(J)
    print(duckdb.sql(f"""
    select g.group_desc, c.op, c.n_members, count(*) n,
      round(median(s.transfer_ns)/1e3,1) slice_us, round(avg(s.transfer_ns)/1e3,1) slice_mean_us
    from '{J}/graph/comms.parquet' c join '{J}/graph/groups.parquet' g using(group_name)
    join '{J}/slices/transfers.parquet' s using(comm_id)
    where c.iteration>=1 group by all order by n desc""").fetchall())
    import prism.bench.scale_slices as ss
    from pathlib import Path
    print('iteration', ss.calibrated_iteration_s(Path(J)))
