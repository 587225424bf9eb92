"""Where the sweep on a truth's own inputs departs from the truth along an iteration's critical path.

    python scripts/model_critical_path.py JOB_DIR ITERATION

The sweep with the measured-run inputs (`durations.measured_run`); its critical path of ITERATION
(`prism.calibrate.stage.critical_path_table`); for every event on it d = sweep end - truth end, aligned at the
path's first event. Prints the events where d moves by more than 0.2 ms (and markers of over 1 ms wall).
"""
import sys
from pathlib import Path

import numpy as np

from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_MARKER, KINDS
from prism.calibrate.stage import critical_path_table, load_graph
from prism.calibrate.sweep import discover

d, k = Path(sys.argv[1]), int(sys.argv[2])
tj = load_graph(d)
g, c = tj.graph, tj.columns
ts, te = c["t_start_ns"], c["t_end_ns"]
dur, xfer = rules.measured_run(g.kind, g.comm, g.wait_op, c["own_ns"], ts, te, c["t_complete_ns"], g.n_comms)
_, tl = discover(g, dur, xfer)
cp = critical_path_table(tj, tl, dur).to_pandas()
pos = np.searchsorted(tj.event_ids, cp[cp.iteration == k].event_id.to_numpy())
off = tl.end_ns[pos[0]] - te[pos[0]]
prev = 0
print(f"{d} iteration {k}: critical path of {len(pos)} events; d = sweep end - truth end (aligned at its start)")
for p in pos:
    dd = tl.end_ns[p] - te[p] - off
    if abs(dd - prev) > 200_000 or (g.kind[p] == K_MARKER and te[p] - ts[p] > 1e6):
        r, s = g.where(int(p))
        print(f"  rank {r} seq {s} {KINDS[g.kind[p]]:10s} sweep {tl.start_ns[p] / 1e6:9.3f}-{tl.end_ns[p] / 1e6:9.3f}"
              f" truth span {(te[p] - ts[p]) / 1e6:7.3f} sweep duration {(tl.end_ns[p] - tl.start_ns[p]) / 1e6:7.3f}"
              f"  d {dd / 1e6:+7.3f} (step {(dd - prev) / 1e6:+.3f})")
    prev = dd
print(f"  at the iteration's end d = {prev / 1e6:+.3f} ms")
