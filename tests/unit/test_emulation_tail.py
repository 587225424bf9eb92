"""The emulation's computed rows after the live ones (`prism.emulate.tail`): swept by the clock rule from the live
rows' times, so that no computed wait ends before its comm's last member arrived (a flow arrow of the export
pointing backwards, seen on the tiny job: a replayed rank's computed last wait ended before the sandbox's
measured issue of the same all-reduce)."""

from __future__ import annotations

import numpy as np

from prism import schemas
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_RECV, K_SEND, K_WAIT, SweepGraph
from prism.calibrate.sweep import Timeline
from prism.emulate.outputs import one_clock
from prism.emulate.tail import sweep_tails

# 3 ranks, one all-reduce (comm 0) of all three: compute, issue, wait each.
# rank 0: replayed (live) up to its issue, its wait computed; rank 1: the sandbox (all live); rank 2: computed.
GRAPH = SweepGraph(rank_ptr=np.array([0, 3, 6, 9]), kind=np.array([K_COMPUTE, K_COLLECTIVE, K_WAIT] * 3, np.int8),
                   comm=np.array([-1, 0, -1] * 3), wait_op=np.array([-1, -1, 1, -1, -1, 4, -1, -1, 7]),
                   comm_p2p=np.array([False]))
DUR = np.array([10, 2, 3, 10, 2, 3, 30, 2, 3])  # own times (a wait: after the completion)
XFER = np.array([5])
# the substituted sweep: every rank arrives by 30, the all-reduce completes at 35, the waits end at 38
SWEPT = Timeline(np.array([0, 10, 12, 0, 10, 12, 0, 30, 32]), np.array([10, 12, 38, 10, 12, 38, 30, 32, 38]),
                 np.array([30]), np.array([35]))
LIVE = np.array([1, 1, 0, 2, 2, 2, 0, 0, 0], np.int8)  # 0 computed, 1 replay, 2 sandbox


def _emulation_clock():
    start, end = SWEPT.start_ns.copy(), SWEPT.end_ns.copy()
    start[0:2], end[0:2] = [0, 11], [11, 13]  # the replayed rank, as the worker drove it
    start[3:6], end[3:6] = [0, 100, 102], [100, 102, 110]  # the sandbox ran its compute 90 ns slower
    return one_clock(GRAPH.rank_ptr, LIVE, SWEPT, start, end)


def _backwards(start, end):
    """(member, wait) pairs whose wait ended before the last member's issue started."""
    last = max(start[i] for i in (1, 4, 7))
    return [w for w in (2, 5, 8) if end[w] < last]


def test_shifted_alone_a_computed_wait_ends_before_the_sandbox_arrived():
    start, end = _emulation_clock()
    assert _backwards(start, end) == [2, 8]  # 38 and 38, before the sandbox's issue at 100


def test_the_tail_is_swept_from_the_live_rows():
    start, end = sweep_tails(GRAPH, LIVE != 0, DUR, XFER, *_emulation_clock())
    assert _backwards(start, end) == []
    # live rows keep their measured times; the computed waits end their own time after 100 + the transfer
    assert (start[:2].tolist(), end[:2].tolist()) == ([0, 11], [11, 13])
    assert (start[3:6].tolist(), end[3:6].tolist()) == ([0, 100, 102], [100, 102, 110])
    assert (start[2], end[2]) == (13, 108)
    # rank 2 has no live row: the rule from its own start (its issue at 30 is still its arrival)
    assert start[6:].tolist() == [0, 30, 32] and end[6:].tolist() == [30, 32, 108]
    rank, seq = np.repeat([0, 1, 2], 3), np.tile([0, 1, 2], 3)
    import pyarrow as pa

    table = pa.table({"rank": rank.astype(np.int32), "seq": seq, "start_ns": start, "end_ns": end})
    assert schemas.timeline_problem(table) is None


def test_a_message_completes_after_the_send_and_not_before_the_recv():
    # rank 0 sends (sandbox, live, late), rank 1 receives and waits (computed)
    graph = SweepGraph(rank_ptr=np.array([0, 2, 4]), kind=np.array([K_COMPUTE, K_SEND, K_RECV, K_WAIT], np.int8),
                       comm=np.array([-1, 0, 0, -1]), wait_op=np.array([-1, -1, -1, 2]), comm_p2p=np.array([True]))
    start, end = np.array([0, 50, 0, 1]), np.array([50, 51, 1, 9])
    live = np.array([True, True, False, False])
    s, e = sweep_tails(graph, live, np.array([50, 1, 1, 2]), np.array([4]), start, end)
    assert s.tolist() == [0, 50, 0, 1] and e.tolist() == [50, 51, 1, 56]  # max(recv 0, send 50 + 4) + 2


def test_the_tail_is_the_calibrate_sweep_with_pins_not_a_loop_of_its_own():
    """One sweep loop (session 10's review): the tail calls `prism.calibrate.sweep` with pinned rows, so it cannot
    drift from the calibration; the sweep's kernels and their reference are held to each other with pins
    (tests/unit/test_calibrate.py)."""
    from pathlib import Path

    from prism.emulate import tail
    from tests.unit.test_runtime_layering import imported_modules

    used = imported_modules(Path(tail.__file__))
    assert "prism.calibrate.sweep" in used and not any(m.split(".")[0] == "numba" for m in used)
