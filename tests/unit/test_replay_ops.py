"""`prism.slices.replay_ops`: the replay server's ops matched to the graph's comms, and whether its issue was
after the slice's last member's (the part of a measured delay that is the server's, not the transfer's)."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from prism import schemas
from prism.runtime import thread_cpu
from prism.slices import replay_ops

NAMES = ("kind", "op", "group_name", "group_seq", "src", "dst", "tag", "virtual_members", "t_ready_ns", "t_issue_ns",
         "t_issued_ns", "t_complete_ns")


def _ops(rows):
    cols = list(zip(*rows))
    return pa.table({n: pa.array(list(c), pa.string() if i < 3 else pa.int32() if i in (4, 5, 7) else pa.int64())
                     for i, (n, c) in enumerate(zip(NAMES, cols))})


def _events(rows):
    """rank, seq, kind, group_name, group_seq, peer, tag, comm_id, event_id, op_event_id, t_start, t_end, t_complete"""
    names = ("rank", "seq", "kind", "group_name", "group_seq", "peer", "tag", "comm_id", "event_id", "op_event_id",
             "t_start_ns", "t_end_ns", "t_complete_ns")
    return pa.table({n: list(c) for n, c in zip(names, zip(*rows))})


# slice rank 0: an all-reduce on group "3" (comm 10; issued at 100, waited until 400), a send to virtual rank 5
# on group "7" (comm 20) and a second one (comm 21), a recv from it (comm 22)
EVENTS = _events([
    (0, 1, "collective", "3", 0, -1, -1, 10, 1, -1, 100, 110, -1),
    (0, 2, "wait", "3", -1, -1, -1, -1, 2, 1, 110, 400, -1),
    (0, 3, "send", "7", -1, 5, 0, 20, 3, -1, 500, 510, -1),
    (0, 4, "send", "7", -1, 5, 0, 21, 4, -1, 600, 610, -1),
    (0, 5, "recv", "7", -1, 5, 0, 22, 5, -1, 700, 705, 800),
])


def test_each_op_the_server_played_gets_the_graph_comm_of_the_slice_ranks_event():
    ops = _ops([("collective", "all_reduce", "3", 0, -1, -1, -1, 3, 50, 60, 70, 390),
                ("recv", "recv", "7", 1, 0, 5, 0, 1, 550, 550, 560, 620),  # the 2nd message 0 -> 5: comm 21
                ("send", "send", "7", 0, 5, 0, 0, 1, 650, 650, 660, 790),
                ("collective", "all_reduce", "3", 9, -1, -1, -1, 3, 0, 0, 0, 0)])  # no such event: -1
    table = replay_ops.with_comm_ids(ops, EVENTS)
    assert table.schema == schemas.SLICE_REPLAY_OPS
    assert table["comm_id"].to_pylist() == [10, 21, 22, -1]


def test_lateness_counts_the_server_issuing_after_the_slice_s_last_member():
    early = replay_ops.with_comm_ids(_ops([("collective", "all_reduce", "3", 0, -1, -1, -1, 3, 50, 60, 70, 390)]),
                                     EVENTS)
    late = replay_ops.with_comm_ids(_ops([("collective", "all_reduce", "3", 0, -1, -1, -1, 3, 90, 95, 2_000_100, 2_000_200)]),
                                    EVENTS)
    (row,) = replay_ops.lateness(early, EVENTS)
    assert (row["n"], row["late_n"], row["late_max_ms"]) == (1, 0, 0.0)
    assert row["delay_median_ms"] == pytest.approx(300 / 1e6)  # 100 -> the wait's end at 400
    (row,) = replay_ops.lateness(late, EVENTS)
    assert (row["late_n"], row["late_max_ms"]) == (1, pytest.approx(2.0))  # issued 2 ms after the slice's 100
    assert row["turnaround_median_ms"] == pytest.approx((2_000_100 - 90) / 1e6)
    assert "issued after the slice's last member 1" in replay_ops.describe([row])


def test_runq_wait_is_read_per_thread_beside_cpu():
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("no schedstat here")
    waits = thread_cpu.runq_wait_by_thread()
    assert "MainThread" in waits and all(v >= 0 for v in waits.values())
    assert set(waits) == set(thread_cpu.by_thread())
