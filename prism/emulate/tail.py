"""The emulation's computed rows that follow live ones, swept by the clock rule from the live rows' times.

A rank's computed rows after its last live (sandbox or replay) row, and every row of a rank with no live row,
are what the model says happens next *given what ran live*: the clock rule (`prism.clock_rule`, the
calibrate sweep's) with the substituted durations and the calibrated transfers, where every live row keeps
its measured time and counts as its rank's arrival when it is an issue. Shifting the substituted sweep onto
the rank's own live rows alone (`outputs.one_clock`) keeps each rank in order but not the ranks together: on
the tiny job a replayed rank's last wait, computed, ended before the sandbox rank's measured issue of the
same all-reduce (the sweep had the sandbox arrive earlier than it did), a completion before the last
arrival that `prism export` counted as an arrow pointing backwards (``flows_left_out``). Here a computed
wait on a comm ends no earlier than the rule's completion over the members' arrivals as the emulation
has them, measured or computed, so every arrow runs forward.

Rows before a rank's first live row keep `one_clock`'s times (nothing real could move them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prism.calibrate.arrays import K_COLLECTIVE, K_RECV, K_SEND, K_WAIT, SweepGraph
from prism.clock_rule import NEG, collective_done, ends, p2p_done, wait_ends


@njit(cache=True)
def _sweep_from_pins(rank_ptr, kind, comm, wait_op, comm_p2p, n_members, dur, xfer, pinned, start, end):
    """In place: every event not `pinned` gets the rule's start and end; pinned ones keep theirs. Returns the
    number of events left unswept (> 0: a wait whose comm never completes)."""
    w = len(rank_ptr) - 1
    m = len(comm_p2p)
    issued = np.zeros(m, dtype=np.int64)  # members whose issue is placed
    last = np.full(m, NEG, dtype=np.int64)  # the latest issue start (a collective's last arrival)
    send_t = np.full(m, NEG, dtype=np.int64)
    recv_t = np.full(m, NEG, dtype=np.int64)
    cursor = rank_ptr[:-1].copy()
    clock = np.zeros(w, dtype=np.int64)
    left = len(kind)
    while left:
        moved = False
        for r in range(w):
            while cursor[r] < rank_ptr[r + 1]:
                e = cursor[r]
                k = kind[e]
                if pinned[e]:
                    clock[r] = end[e]
                else:
                    t = clock[r]
                    finish = ends(t, dur[e])
                    if k == K_WAIT and wait_op[e] >= 0 and kind[wait_op[e]] != K_SEND:
                        c = comm[wait_op[e]]
                        if issued[c] < n_members[c]:
                            break
                        if comm_p2p[c]:
                            done = p2p_done(recv_t[c], send_t[c], xfer[c])
                        else:
                            done = collective_done(last[c], xfer[c])
                        finish = wait_ends(t, dur[e], done)
                    start[e] = t
                    end[e] = finish
                    clock[r] = finish
                if k == K_COLLECTIVE or k == K_SEND or k == K_RECV:
                    c = comm[e]
                    issued[c] += 1
                    last[c] = max(last[c], start[e])
                    if k == K_SEND:
                        send_t[c] = start[e]
                    elif k == K_RECV:
                        recv_t[c] = start[e]
                cursor[r] += 1
                left -= 1
                moved = True
        if not moved:
            return left
    return 0


def sweep_tails(graph: SweepGraph, live: np.ndarray, durations: np.ndarray, transfers: np.ndarray,
                start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`start`/`end` (every event, rank-major) with the rows after each rank's last live row, and every row of
    a rank with none, swept from the live rows (module docstring); the other rows are returned as given."""
    n = graph.n_events
    if not n:
        return start, end
    ptr = graph.rank_ptr.astype(np.int64)
    idx = np.arange(n, dtype=np.int64)
    rank_of = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    last_live = np.full(len(ptr) - 1, -1, dtype=np.int64)
    np.maximum.at(last_live, rank_of[live], idx[live])
    pinned = idx <= last_live[rank_of]  # live rows and everything before a rank's last live row
    n_members = np.bincount(graph.comm[graph.comm >= 0], minlength=graph.n_comms).astype(np.int64)
    start, end = start.astype(np.int64).copy(), end.astype(np.int64).copy()
    left = _sweep_from_pins(ptr, graph.kind.astype(np.int8), graph.comm.astype(np.int64),
                            graph.wait_op.astype(np.int64), graph.comm_p2p.astype(np.bool_), n_members,
                            durations.astype(np.int64), transfers.astype(np.int64), pinned, start, end)
    if left:
        raise RuntimeError(f"the emulation's computed rows: {left} events never complete (a dependency cycle)")
    return start, end


__all__ = ["sweep_tails"]
