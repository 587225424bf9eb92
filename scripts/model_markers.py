"""Markers whose thread was off the CPU: wall span - CPU time over every marker of real runs.

    python scripts/model_markers.py JOB_DIR [JOB_DIR ...]

Lists the runs with markers off the CPU for over 1 ms, then the distribution over all markers and the ops of the
ones over 1 ms.
"""
import collections
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prism.calibrate.arrays import K_MARKER
from prism.calibrate.stage import load_graph

big = collections.Counter()
offs = []
for d in map(Path, sys.argv[1:]):
    tj = load_graph(d)
    g, c = tj.graph, tj.columns
    m = np.flatnonzero(g.kind == K_MARKER)
    off = (c["t_end_ns"][m] - c["t_start_ns"][m]) - c["cpu_ns"][m]
    ops = pq.read_table(d / "graph" / "events.parquet", columns=["event_id", "op"]).to_pandas()
    ops = ops.set_index("event_id").loc[tj.event_ids[m], "op"].to_numpy()
    offs.append(off)
    big.update(str(o) for o, x in zip(ops, off) if x > 1e6)
    if (off > 1e6).any():
        print(d, "markers off-CPU > 1 ms:", int((off > 1e6).sum()), "max %.3f ms" % (off.max() / 1e6))
offs = np.concatenate(offs)
print("markers %d, off-CPU ms: median %.4f p99 %.4f p99.9 %.3f max %.3f; > 1 ms: %d, by op %s" % (
    len(offs), np.median(offs) / 1e6, np.percentile(offs, 99) / 1e6, np.percentile(offs, 99.9) / 1e6,
    offs.max() / 1e6, (offs > 1e6).sum(), dict(big)))
