"""Per-term decomposition of the model's error on a real run's own inputs, under the clock rule before session 9.

    .venv/bin/python scripts/fidelity_model_terms.py tests/data/fidelity/*

A plain-Python sweep of the old rule (a wait ends at max(start + own, completion), one transfer per comm:
the mean member delay of the slice rule), with one term at a time replaced by what the run spent:
`today` (compute its CPU time), `cwall` (compute its wall span), `cwall+maxX` (and each comm's transfer its
slowest member's delay), `cwall+memberX` / `cpu+memberX` (each member's wait ends at its own delay after the
last issue). Prints the sweep's iteration time's error % against the run's own. Analysis only (docs/fidelity.md,
"The model on the truth's own inputs"); the model's rule is prism/clock_rule.py.
"""
import sys, numpy as np
from pathlib import Path
from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_COMPUTE, K_MARKER, K_WAIT, K_COLLECTIVE, K_SEND, K_RECV
from prism.calibrate.stage import load_graph
from prism.iterations import iteration_times

def psweep(g, dur, kind, comm, wait_op, members, xfer_c, xfer_w, p2p_last, own_w):
    """xfer_w: per wait (event) transfer or None -> xfer_c[comm]; p2p_last: completion=max(send,recv)+x"""
    n = len(kind); W = g.n_ranks; ptr = g.rank_ptr.tolist()
    start = [None]*n; end = [None]*n
    cursor = ptr[:-1]; clock = [0]*W; left = n
    while left:
        moved = False
        for r in range(W):
            while cursor[r] < ptr[r+1]:
                e = cursor[r]; t = clock[r]; fin = t + dur[e]
                if kind[e] == K_WAIT and wait_op[e] >= 0 and kind[wait_op[e]] != K_SEND:
                    c = comm[wait_op[e]]
                    ms = members[c]
                    iss = [start[m] for m in ms]
                    if any(x is None for x in iss): break
                    x = xfer_w[e] if xfer_w is not None and xfer_w[e] is not None else xfer_c[c]
                    if kind[wait_op[e]] == K_RECV and not p2p_last:
                        snd = [start[m] for m in ms if kind[m] == K_SEND][0]
                        rcv = start[wait_op[e]]
                        done = max(rcv, snd + x)
                    else:
                        done = max(iss) + x
                    fin = max(t + own_w[e], done)
                start[e] = t; end[e] = fin; clock[r] = fin; cursor[r] += 1; left -= 1; moved = True
        if not moved: raise RuntimeError("stuck")
    return np.array(end)

def main(d):
    tj = load_graph(Path(d))
    g, c = tj.graph, tj.columns
    k = g.kind; s, e, tc = c["t_start_ns"], c["t_end_ns"], c["t_complete_ns"]
    dur, _ = rules.bare_graph(k, g.comm, g.wait_op, c["own_ns"], s, e, tc, g.n_comms)
    span = np.maximum(e - s, 0)
    kl, cl, wl = k.tolist(), g.comm.tolist(), g.wait_op.tolist()
    is_op = (k == K_COLLECTIVE) | (k == K_SEND) | (k == K_RECV)
    members = [[] for _ in range(g.n_comms)]
    for i in np.flatnonzero(is_op).tolist(): members[cl[i]].append(i)
    # seen time of each member op (not sends): its wait's end, else t_complete
    seen = np.full(len(k), -1, np.int64)
    seen[is_op & (k != K_SEND)] = tc[is_op & (k != K_SEND)]
    waits = np.flatnonzero((k == K_WAIT) & (g.wait_op >= 0))
    wo = g.wait_op[waits]; ok = k[wo] != K_SEND
    seen[wo[ok]] = e[waits[ok]]
    last = np.full(g.n_comms, -2**62, np.int64); np.maximum.at(last, g.comm[is_op], s[is_op])
    sendst = np.full(g.n_comms, -2**62, np.int64); sel = k == K_SEND; np.maximum.at(sendst, g.comm[sel], s[sel])
    mem = np.flatnonzero(is_op & (seen >= 0))
    def mean_from(base):
        tot = np.zeros(g.n_comms); cnt = np.zeros(g.n_comms)
        np.add.at(tot, g.comm[mem], np.maximum(seen[mem] - base[g.comm[mem]], 0)); np.add.at(cnt, g.comm[mem], 1)
        return np.where(cnt > 0, tot/np.maximum(cnt, 1), 0).astype(np.int64)
    x_last = mean_from(last)
    totm = np.zeros(g.n_comms, np.int64); np.maximum.at(totm, g.comm[mem], np.maximum(seen[mem] - last[g.comm[mem]], 0)); x_max = totm
    p2p = g.comm_p2p
    x_send = np.where(p2p, mean_from(np.where(p2p, sendst, last)), x_last)
    # per-wait transfer (member-exact)
    xw_last = [None]*len(k); xw_send = [None]*len(k)
    for w, o in zip(waits.tolist(), wo.tolist()):
        if kl[o] == K_SEND: continue
        cc = cl[o]
        xw_last[w] = max(int(seen[o] - last[cc]), 0)
        xw_send[w] = max(int(seen[o] - (sendst[cc] if p2p[cc] else last[cc])), 0)
    own = dur.copy()
    ends = np.flatnonzero(tj.iteration_end)
    truth = iteration_times(tj.iteration[ends], e[ends]).median_ms
    dw = np.where(k == K_COMPUTE, span, dur)
    dwl, dl = dw.tolist(), dur.tolist(); ownl = own.tolist()
    res = {}
    def go(name, dd, xc, xw, p2pl):
        end = psweep(g, dd, kl, cl, wl, members, xc.tolist(), xw, p2pl, ownl)
        res[name] = iteration_times(tj.iteration[ends], end[ends]).median_ms
    go("today", dl, x_last, None, False)
    go("cwall", dwl, x_last, None, False)
    go("cwall+maxX", dwl, x_max, None, True)
    go("cpu+maxX", dl, x_max, None, True)
    go("cwall+memberX", dwl, x_last, xw_last, True)
    go("cpu+memberX", dl, x_last, xw_last, True)
    # wait own = span after seen? per-member exact incl own: own = end - max(start, seen)
    print(f"{Path(d).name:28s} truth {truth:7.2f} " + " ".join(f"{n} {100*(v-truth)/truth:+5.2f}" for n, v in res.items()), flush=True)

for d in sys.argv[1:]: main(d)
