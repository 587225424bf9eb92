"""The model on a truth's own inputs, per iteration: the gaps between iteration ends, the run's and the sweep's.

    python scripts/model_iters.py JOB_DIR [JOB_DIR ...]

The sweep is fed the run's own durations and transfers (`prism.calibrate.durations.measured_run`, as
`python -m prism.bench.fidelity_model` does); an iteration's end is its last ``iteration_end`` marker's end.
"""
import collections
import sys
from pathlib import Path

import numpy as np

from prism.calibrate import durations as rules
from prism.calibrate.stage import iterations_table, load_graph
from prism.calibrate.sweep import discover

for d in map(Path, sys.argv[1:]):
    tj = load_graph(d)
    g, c = tj.graph, tj.columns
    dur, transfer = rules.measured_run(g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"], c["t_end_ns"],
                                       c["t_complete_ns"], g.n_comms)
    _, timeline = discover(g, dur, transfer)
    it = iterations_table(tj, timeline)
    ends = np.flatnonzero(tj.iteration_end)
    tr = collections.defaultdict(int)
    for i, t in zip(tj.iteration[ends], c["t_end_ns"][ends]):
        tr[int(i)] = max(tr[int(i)], int(t))
    sw = collections.defaultdict(int)
    for i, t in zip(it["iteration"].to_pylist(), it["end_ns"].to_pylist()):
        sw[int(i)] = max(sw[int(i)], int(t))
    ks = sorted(tr)
    print(d, "truth gaps", [round((tr[k] - tr[k - 1]) / 1e6, 1) for k in ks[1:]])
    print("   sweep gaps", [round((sw[k] - sw[k - 1]) / 1e6, 1) for k in ks[1:] if k in sw and k - 1 in sw])
