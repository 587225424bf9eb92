"""Send/recv pairs of real runs: is a gloo send/recv a rendezvous (the data moves once both are posted)?

    python scripts/model_p2p.py JOB_DIR [JOB_DIR ...]

Per run, over its send/recv pairs whose recv was posted after the send: how long after the recv's issue the
send's wait ended and the recv side saw completion (ms, median / p90), against the send's issue; and what the
clock rule (`prism.clock_rule.p2p_done` = max(recv issue, send issue + transfer)) with the measured-run transfer
(from the last issue, `durations.bare_graph`) puts the completion early by: min(recv - send, transfer).
"""
import sys
from pathlib import Path

import numpy as np

from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_RECV, K_SEND, K_WAIT
from prism.calibrate.stage import load_graph

print("| run | pairs | recv posted after the send | send wait ends after the recv's issue, ms med/p90 | "
      "recv sees it after its issue, med/p90 | ... after the send's issue, med/p90 | rule early by, ms med/max |")
print("|---|---|---|---|---|---|---|")
for d in map(Path, sys.argv[1:]):
    tj = load_graph(d)
    g, c = tj.graph, tj.columns
    ts, te, tc = c["t_start_ns"], c["t_end_ns"], c["t_complete_ns"]
    _, xfer = rules.bare_graph(g.kind, g.comm, g.wait_op, c["own_ns"], ts, te, tc, g.n_comms)
    m = g.n_comms
    send, recv, swe, seen = (np.full(m, -1, np.int64) for _ in range(4))
    s = np.flatnonzero(g.kind == K_SEND); r = np.flatnonzero(g.kind == K_RECV)
    send[g.comm[s]] = ts[s]; recv[g.comm[r]] = ts[r]; seen[g.comm[r]] = tc[r]
    w = np.flatnonzero((g.kind == K_WAIT) & (g.wait_op >= 0))
    ws, wr = w[g.kind[g.wait_op[w]] == K_SEND], w[g.kind[g.wait_op[w]] == K_RECV]
    swe[g.comm[g.wait_op[ws]]] = te[ws]; seen[g.comm[g.wait_op[wr]]] = te[wr]
    p = np.flatnonzero(g.comm_p2p & (send >= 0) & (recv >= 0) & (swe >= 0) & (seen >= 0))
    if not len(p):
        continue
    late = p[recv[p] > send[p]]
    q = lambda v: f"{np.median(v) / 1e6:.3f} / {np.percentile(v, 90) / 1e6:.3f}" if len(v) else "-"
    early = np.minimum(recv[late] - send[late], xfer[late])
    print(f"| {d} | {len(p)} | {len(late)} | {q(swe[late] - recv[late])} | {q(seen[late] - recv[late])} | "
          f"{q(seen[late] - send[late])} | {np.median(early) / 1e6:.3f} / {early.max() / 1e6:.3f} |")
