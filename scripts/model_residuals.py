"""Where the measured-run rule does not reproduce a real run: every event's local residual on the truth's own times.

    python scripts/model_residuals.py JOB_DIR [JOB_DIR ...]

For every event the clock rule applied to the truth's own timestamps (its start, the comm's arrivals) with the
measured-run inputs (`prism.calibrate.durations.measured_run`), against the truth's own end:
residual = rule end - truth end (negative: the rule ends the event early). A gap (start - previous end on the
rank) counts as a residual of the event after it. Per kind and iteration the sum over ranks of the residuals,
and the worst events (waits on sends left out: the rule takes them as local, and the time a run blocked in one
is its residual; it reaches the iteration only where nothing later on that rank waits longer).
"""
import sys
from pathlib import Path

import numpy as np

from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_COLLECTIVE, K_RECV, K_SEND, K_WAIT, KINDS
from prism.calibrate.stage import load_graph

for d in map(Path, sys.argv[1:]):
    tj = load_graph(d)
    g, c = tj.graph, tj.columns
    ts, te = c["t_start_ns"], c["t_end_ns"]
    dur, xfer = rules.measured_run(g.kind, g.comm, g.wait_op, c["own_ns"], ts, te, c["t_complete_ns"], g.n_comms)
    n = len(ts)
    is_op = np.isin(g.kind, (K_COLLECTIVE, K_SEND, K_RECV))
    ops = np.flatnonzero(is_op)
    last = np.full(g.n_comms, -(2**62), dtype=np.int64)
    np.maximum.at(last, g.comm[ops], ts[ops])
    send_start = np.full(g.n_comms, -(2**62), dtype=np.int64)
    recv_start = np.full(g.n_comms, -(2**62), dtype=np.int64)
    s = np.flatnonzero(g.kind == K_SEND)
    send_start[g.comm[s]] = ts[s]
    r = np.flatnonzero(g.kind == K_RECV)
    recv_start[g.comm[r]] = ts[r]
    done = np.where(g.comm_p2p, np.maximum(recv_start, send_start + xfer), last + xfer)
    end = ts + dur
    w = np.flatnonzero((g.kind == K_WAIT) & (g.wait_op >= 0))
    tgt = g.wait_op[w]
    blocking = g.kind[tgt] != K_SEND
    wb = w[blocking]
    end[wb] = np.maximum(ts[wb], done[g.comm[tgt[blocking]]]) + dur[wb]
    res = end - te
    gap = np.zeros(n, dtype=np.int64)
    first = np.zeros(n, dtype=bool)
    first[g.rank_ptr[:-1][np.diff(g.rank_ptr) > 0]] = True
    gap[1:] = ts[1:] - te[:-1]
    gap[first] = 0
    res_all = res - gap
    label = np.array([KINDS[k] for k in g.kind], dtype=object)
    sub = label.copy()
    sub[wb] = np.where(g.comm_p2p[g.comm[tgt[blocking]]], "wait(recv)", "wait(coll)")
    sub[w[~blocking]] = "wait(send)"  # local in the rule: its residual is the time the run blocked in it
    print(f"== {d}")
    print("  sum of residuals per kind, ms, per iteration (all ranks):")
    its = np.unique(tj.iteration)
    kinds = sorted(set(sub))
    print("   it " + " ".join(f"{k:>11}" for k in kinds) + "        gap")
    for it in its:
        m = tj.iteration == it
        print(f"  {it:3d} " + " ".join(f"{res[m & (sub == k)].sum() / 1e6:11.3f}" for k in kinds)
              + f" {-gap[m].sum() / 1e6:10.3f}")
    ranked = np.argsort(res_all)
    worst = ranked[sub[ranked] != "wait(send)"][:12]
    print("  worst events but waits on sends (residual incl. gap, ms):")
    for e in worst:
        rk, sq = g.where(int(e))
        extra = ""
        if g.kind[e] == K_WAIT and g.wait_op[e] >= 0:
            t = g.wait_op[e]
            cm = g.comm[t]
            rel = lambda t: (t - ts[e]) / 1e6  # noqa: E731
            extra = (f" on {KINDS[g.kind[t]]} comm {cm} p2p={bool(g.comm_p2p[cm])} done_rule={rel(done[cm]):.3f}"
                     f" last_issue={rel(last[cm]):.3f} send={rel(send_start[cm]):.3f}"
                     f" recv={rel(recv_start[cm]):.3f} xfer={xfer[cm] / 1e6:.3f}")
        print(f"   rank {rk} seq {sq} it {tj.iteration[e]} {sub[e]} span {(te[e]-ts[e])/1e6:.3f} dur {dur[e]/1e6:.3f}"
              f" res {res[e]/1e6:.3f} gap {gap[e]/1e6:.3f}{extra}")
