"""The virtual ranks' discrete-event loop (prism.runtime.timed_replay) on a hand-made calibrated job."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq

from prism import schemas
from prism.runtime.timed_replay import TimedReplay


def _job(tmp_path):
    """W=3, sandbox {0}. Ranks 1 and 2 share a virtual-only collective (comm 0, group "v"), then all three
    ranks a real one (comm 1, group "w"). Calibrated times in ns: (rank, seq, kind, comm, waits-on-seq,
    start, end)."""
    spec = [
        (0, 0, "collective", 1, -1, 0, 10), (0, 1, "wait", -1, 0, 10, 500),
        (1, 0, "compute", -1, -1, 0, 100), (1, 1, "collective", 0, -1, 100, 110), (1, 2, "wait", -1, 1, 110, 300),
        (1, 3, "compute", -1, -1, 300, 350), (1, 4, "collective", 1, -1, 350, 360), (1, 5, "wait", -1, 4, 360, 500),
        (2, 0, "compute", -1, -1, 0, 250), (2, 1, "collective", 0, -1, 250, 260), (2, 2, "wait", -1, 1, 260, 300),
        (2, 3, "compute", -1, -1, 300, 320), (2, 4, "collective", 1, -1, 320, 330), (2, 5, "wait", -1, 4, 330, 500),
    ]
    ids = {(r, s): i for i, (r, s, *_) in enumerate(spec)}
    rows, tl = [], []
    for i, (rank, seq, kind, comm, on, start, end) in enumerate(spec):
        group = None if kind == "compute" else ("v" if comm == 0 or (on >= 0 and rank and seq == 2) else "w")
        rows.append(dict(event_id=i, rank=rank, seq=seq, kind=kind, op="compute" if kind == "compute" else "all_reduce",
                         group=group, group_seq=0 if kind == "collective" else -1, peer=-1, tag=0, bytes=4,
                         dtype=None, shape=None, is_async=False, work_id=-1, iteration=0, microbatch=-1,
                         t_start_ns=start, t_end_ns=end, cpu_ns=0, device_ns=0, t_complete_ns=-1, mem_bytes=-1,
                         mem_peak_bytes=-1, mem_reserved_bytes=-1, stream=0, comm_id=comm,
                         op_event_id=ids[(rank, on)] if on >= 0 else -1))
        tl.append(dict(rank=rank, seq=seq, event_id=i, start_ns=start, end_ns=end))
    (tmp_path / "graph").mkdir()
    (tmp_path / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.EVENTS), tmp_path / "graph" / "events.parquet")
    pq.write_table(pa.Table.from_pylist(tl, schema=schemas.TIMELINE), tmp_path / "calibrated" / "timeline.parquet")
    return tmp_path / "graph" / "events.parquet", tmp_path / "calibrated" / "timeline.parquet"


def test_virtual_only_ops_are_computed_and_real_ones_wait_for_the_sandbox(tmp_path):
    replay = TimedReplay(*_job(tmp_path), sandbox={0})
    assert replay.real == {1} and replay.transfer[0] == 300 - 250  # first member's wait end - last arrival
    t0 = time.monotonic_ns()
    loop = threading.Thread(target=replay.run, args=(t0,))
    loop.start()
    replay.gate(1)  # returns once ranks 1 and 2 arrived at comm 1 (350 and 320 ns after t0)
    assert replay.arrivals[1] == {1: 350, 2: 320}
    time.sleep(0.05)  # the sandbox's op takes 50 ms: the virtual ranks' waits end then, not at 500 ns
    replay.complete(1)
    loop.join(5)
    assert not loop.is_alive()
    done = replay.completion[1]
    assert done >= 50_000_000
    got = {(r["rank"], r["seq"]): (r["t_start_ns"] - t0, r["t_end_ns"] - t0) for r in replay.table().to_pylist()}
    assert got == {
        # rank 1 parks in its wait on comm 0 until rank 2 arrives (250) + the calibrated transfer (50)
        (1, 0): (0, 100), (1, 1): (100, 110), (1, 2): (110, 300), (1, 3): (300, 350), (1, 4): (350, 360),
        (1, 5): (360, done),
        (2, 0): (0, 250), (2, 1): (250, 260), (2, 2): (260, 300), (2, 3): (300, 320), (2, 4): (320, 330),
        (2, 5): (330, done),
    }
    complete = {(r["rank"], r["seq"]): r["t_complete_ns"] - t0 for r in replay.table().to_pylist()
                if r["kind"] == "collective"}
    assert complete[(2, 1)] == 300 and complete[(1, 1)] == 300


def test_steps_limit_drives_only_the_first_iterations(tmp_path):
    """Events of later iterations are not replayed; their real ops pass the gate at once (never hang)."""
    events, timeline = _job(tmp_path)
    table = pq.read_table(events).to_pylist()
    for r in table:
        r["iteration"] = 1 if r["seq"] >= 3 else 0  # comm 1 (seq 4) lies in iteration 1
    pq.write_table(pa.Table.from_pylist(table, schema=schemas.EVENTS), events)
    replay = TimedReplay(events, timeline, sandbox={0}, steps_limit=1)
    replay.run(time.monotonic_ns())
    assert sorted({(r["rank"], r["seq"]) for r in replay.table().to_pylist()}) == \
        [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    started = time.monotonic()
    replay.gate(1)
    assert time.monotonic() - started < 1
