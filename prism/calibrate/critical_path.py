"""The critical path of a calibrated timeline: the chain of events that set the job's end.

Walk back from an event (the last ``iteration_end`` marker) through each event's binding dependency:

- a wait on a collective or a recv is bound by the comm's last arrival (the collective member, or the
  send, issued last: a comm starts at its last member's issue, see `prism.calibrate.sweep`) when that
  arrival is on another rank and the wait was blocked: it ended later than its own duration allows
  (``end > start + duration``, when the durations are given), or else, without durations, that arrival
  was issued after the wait started. The path then jumps to that rank;
- every other event (and a wait whose comm had all arrived before it started) is bound by program order:
  the rank's previous event, which it starts after (`prism.calibrate.sweep`: an event starts when its
  rank's previous event ended).

The walk stops at a rank's first event, or before the first event that ends at or before ``stop_ns``
(the path then holds the events that overlap the window after ``stop_ns``).
A pure function of the graph's arrays and the timeline's starts and ends.
"""

from __future__ import annotations

import numpy as np

from prism.calibrate.arrays import K_COLLECTIVE, K_RECV, K_SEND, K_WAIT, SweepGraph


def last_arrivals(graph: SweepGraph, start_ns: np.ndarray) -> np.ndarray:
    """Per comm, the event (collective member or send) issued last; -1 for none (ties: the later event)."""
    kind, comm = graph.kind, graph.comm
    arrive = np.flatnonzero(((kind == K_COLLECTIVE) | (kind == K_SEND)) & (comm >= 0))
    out = np.full(graph.n_comms, -1, dtype=np.int64)
    if len(arrive):
        # sort by (comm, start, event): the last of each comm's run is its latest arrival
        order = np.lexsort((arrive, start_ns[arrive], comm[arrive]))
        ranked = arrive[order]
        c = comm[ranked]
        last = np.r_[c[1:] != c[:-1], True]
        out[c[last]] = ranked[last]
    return out


def critical_path(graph: SweepGraph, start_ns: np.ndarray, end_ns: np.ndarray, last_event: int,
                  stop_ns: int | None = None, durations: np.ndarray | None = None,
                  arrival: np.ndarray | None = None) -> np.ndarray:
    """The event positions on the critical path ending at `last_event`, in time order (first to last).

    `durations` (int64[n], optional): each event's own duration, the calibrate stage's input; `arrival`:
    `last_arrivals` of these starts, when the caller walks several paths of one timeline. Memory: the path's,
    not the graph's (no per-event array is allocated)."""
    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    if not 0 <= last_event < graph.n_events:
        raise ValueError(f"last_event {last_event} is not an event position (0..{graph.n_events - 1})")
    arrival = last_arrivals(graph, start_ns) if arrival is None else arrival
    rank_ptr = graph.rank_ptr

    def rank_of(e: int) -> int:
        return int(np.searchsorted(rank_ptr, e, side="right")) - 1

    path = [last_event]
    seen = {last_event}
    e = last_event
    while True:
        nxt = -1
        if graph.kind[e] == K_WAIT:
            op = int(graph.wait_op[e])
            if op >= 0 and graph.kind[op] in (K_COLLECTIVE, K_RECV) and graph.comm[op] >= 0:
                a = int(arrival[graph.comm[op]])
                if a >= 0 and rank_of(a) != rank_of(e):
                    blocked = (end_ns[e] > start_ns[e] + durations[e] if durations is not None
                               else start_ns[a] > start_ns[e])
                    if blocked:
                        nxt = a
        if nxt < 0:
            if e == rank_ptr[rank_of(e)]:
                break
            nxt = e - 1
        if stop_ns is not None and end_ns[nxt] <= stop_ns:
            break
        if nxt in seen:
            raise ValueError(f"the timeline is not causal: the walk back from event {last_event} comes back to "
                             f"{graph.describe(nxt)}")
        seen.add(nxt)
        path.append(nxt)
        e = nxt
    return np.array(path[::-1], dtype=np.int64)


__all__ = ["critical_path", "last_arrivals"]
