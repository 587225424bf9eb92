"""The critical path walk on hand-made graphs, timed by the sweep (hand-computed times in comments)."""

from __future__ import annotations

import numpy as np
import pytest

from prism.calibrate.critical_path import critical_path, last_arrivals
from prism.calibrate.sweep import sweep
from prism.calibrate.synthetic import from_programs


def timed(programs, transfer=None):
    syn = from_programs(programs, transfer)
    t = sweep(syn.graph, syn.durations, syn.transfer)
    return syn, t.start_ns, t.end_ns


def test_a_wait_on_a_late_rank_jumps_to_that_rank():
    # rank 0: compute 0-10, coll 10-11, wait 11-56 (rank 1 issued at 50, transfer 5, own 1), compute 56-60
    # rank 1: compute 0-50, coll 50-52, wait 52-56, compute 56-59 (shorter: not the last)
    syn, start, end = timed([
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 1), ("compute", 4)],
        [("compute", 50), ("coll", "A", 2), ("wait", 1, 1), ("compute", 3)],
    ], transfer={"A": 5})
    assert end.tolist() == [10, 11, 56, 60, 50, 52, 56, 59]
    assert last_arrivals(syn.graph, start).tolist() == [5]  # rank 1's member, issued at 50
    path = critical_path(syn.graph, start, end, last_event=3)
    # rank 0's last compute <- its wait <- rank 1's collective (issued last) <- rank 1's first compute
    assert path.tolist() == [4, 5, 2, 3]
    with_durations = critical_path(syn.graph, start, end, 3, durations=syn.durations)
    assert with_durations.tolist() == [4, 5, 2, 3]  # the wait took 45 > its own 1: blocked


def test_a_wait_whose_comm_had_arrived_follows_program_order():
    # rank 0 arrives last (at 30); its own wait is not blocked by anyone else
    syn, start, end = timed([
        [("compute", 30), ("coll", "A", 1), ("wait", 1, 2), ("compute", 5)],
        [("compute", 5), ("coll", "A", 1), ("wait", 1, 1), ("compute", 1)],
    ])
    assert end.tolist()[:4] == [30, 31, 33, 38]
    assert critical_path(syn.graph, start, end, 3).tolist() == [0, 1, 2, 3]


def test_recv_waits_for_the_send_and_the_walk_stops_at_stop_ns():
    # rank 0: compute 0-100, send 100-103, wait 103-104; rank 1: recv 0-2, wait 2-108 (send 100 + 7, own 1),
    # compute 108-118
    syn, start, end = timed([
        [("compute", 100), ("send", "m", 3), ("wait", 1, 1)],
        [("recv", "m", 2), ("wait", 0, 1), ("compute", 10)],
    ], transfer={"m": 7})
    assert end.tolist() == [100, 103, 104, 2, 108, 118]
    assert critical_path(syn.graph, start, end, 5).tolist() == [0, 1, 4, 5]
    assert critical_path(syn.graph, start, end, 5, stop_ns=100).tolist() == [1, 4, 5]


def test_transfer_bound_wait_jumps_only_with_durations():
    # both ranks issue at 2 (the tie goes to the later event: rank 1's), rank 0's wait starts at 3 and ends
    # at 2 + 50 (transfer) + 1 (own) = 53: only the durations (own 1, took 50) tell that the wait was blocked
    syn, start, end = timed([
        [("compute", 2), ("coll", "A", 1), ("wait", 1, 1)],
        [("compute", 2), ("coll", "A", 1), ("wait", 1, 1)],
    ], transfer={"A": 50})
    assert start.tolist() == [0, 2, 3, 0, 2, 3] and end.tolist() == [2, 3, 53, 2, 3, 53]
    assert last_arrivals(syn.graph, start).tolist() == [4]
    assert critical_path(syn.graph, start, end, 2).tolist() == [0, 1, 2]  # issued at 2, not after 3
    assert critical_path(syn.graph, start, end, 2, durations=syn.durations).tolist() == [3, 4, 2]
    # rank 1's own wait: its comm's last arrival is its own op: program order either way
    assert critical_path(syn.graph, start, end, 5, durations=syn.durations).tolist() == [3, 4, 5]


def test_bad_last_event_and_non_causal_timeline_are_errors():
    syn, start, end = timed([
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 1)],
        [("compute", 50), ("coll", "A", 2), ("wait", 1, 1)],
    ])
    with pytest.raises(ValueError, match="not an event position"):
        critical_path(syn.graph, start, end, 99)
    # a made-up timeline of a deadlocked graph, each wait jumping to the other rank's later arrival
    cyc = from_programs([
        [("coll", "A", 1), ("wait", 0, 1), ("coll", "B", 1)],
        [("coll", "B", 1), ("wait", 0, 1), ("coll", "A", 1)],
    ])
    start = np.array([0, 1, 9, 0, 1, 5])
    with pytest.raises(ValueError, match="not causal"):
        critical_path(cyc.graph, start, start + 1, 1)
