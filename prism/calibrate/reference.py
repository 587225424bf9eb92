"""The sweep in plain Python, written to be obviously right; tests hold the numba kernels to it exactly.

It follows the rules word for word: round after round, every rank runs its events in program order as
far as their dependencies allow; a wait on a collective needs every member's op to have been issued, a
wait on a recv needs the matching send. A round in which no rank moves while events remain means a
dependency cycle. A pinned row (`arrays.Pins`) takes its given start and end and waits for nothing; its
rank's clock is its end after it. Slow (a few million events a second at best): for tests and the
benchmark's baseline.
"""

from __future__ import annotations

import numpy as np

from prism.calibrate.arrays import (
    K_COLLECTIVE,
    K_RECV,
    K_SEND,
    K_WAIT,
    Pins,
    SweepError,
    SweepGraph,
    check_durations,
    check_pins,
    validate,
)
from prism.calibrate.sweep import Timeline
from prism.clock_rule import collective_done, ends, p2p_done, wait_ends


def sweep(graph: SweepGraph, durations: np.ndarray, transfer: np.ndarray, pins: Pins | None = None) -> Timeline:
    """Every event's start and end, every comm's start (last arrival) and completion."""
    validate(graph)
    durations, transfer = check_durations(graph, durations, transfer)
    pinned, pin_start, pin_end = [False] * graph.n_events, None, None
    if pins is not None:
        pins = check_pins(graph, pins)
        pinned, pin_start, pin_end = pins.rows.tolist(), pins.start_ns.tolist(), pins.end_ns.tolist()
    n, w, m = graph.n_events, graph.n_ranks, graph.n_comms
    kind = graph.kind.tolist()
    comm = graph.comm.tolist()
    wait_op = graph.wait_op.tolist()
    dur = durations.tolist()
    xfer = transfer.tolist()
    p2p = graph.comm_p2p.tolist()
    ptr = graph.rank_ptr.tolist()

    members: list[list[int]] = [[] for _ in range(m)]  # the op events of every comm
    for e in range(n):
        if kind[e] in (K_COLLECTIVE, K_SEND, K_RECV):
            members[comm[e]].append(e)
    start: list[int | None] = [None] * n
    end: list[int | None] = [None] * n

    def completion(c: int) -> int | None:
        """When comm `c` completes, or None while one of its members has not issued its op."""
        issued = [start[e] for e in members[c]]
        if any(t is None for t in issued):
            return None
        if p2p[c]:
            send = next(e for e in members[c] if kind[e] == K_SEND)
            recv = next(e for e in members[c] if kind[e] == K_RECV)
            return int(p2p_done(start[recv], start[send], xfer[c]))
        return int(collective_done(max(issued), xfer[c]))

    cursor = ptr[:-1]
    clock = [0] * w
    left = n
    while left:
        moved = False
        for r in range(w):
            while cursor[r] < ptr[r + 1]:
                e = cursor[r]
                t = clock[r]
                finish = int(ends(t, dur[e]))
                if pinned[e]:  # given: it waits for nothing
                    t, finish = pin_start[e], pin_end[e]
                elif kind[e] == K_WAIT and kind[wait_op[e]] != K_SEND:  # sends complete locally
                    done = completion(comm[wait_op[e]])
                    if done is None:
                        break
                    finish = int(wait_ends(t, dur[e], done))
                start[e], end[e] = t, finish
                clock[r] = finish
                cursor[r] += 1
                left -= 1
                moved = True
        if not moved:
            blocked = [cursor[r] for r in range(w) if cursor[r] < ptr[r + 1]]
            raise SweepError(
                "dependency cycle: " + "; ".join(f"{graph.describe(e)} never completes" for e in blocked[:4])
                + f" ({len(blocked)} ranks cannot progress)"
            )

    comm_start = [max(start[e] for e in members[c]) for c in range(m)]
    comm_end = [completion(c) for c in range(m)]
    as_array = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    return Timeline(as_array(start), as_array(end), as_array(comm_start), as_array(comm_end))
