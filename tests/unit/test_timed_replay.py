"""The virtual ranks' clock (prism.runtime.replay.clock) and the sandbox's cone (prism.runtime.replay.cone) on
hand-made calibrated jobs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import schemas
from prism.runtime.replay import cone
from prism.runtime.emulate.common_start import common_start
from prism.runtime.replay.clock import TimedReplay

# W=3, sandbox {0}. All three ranks take part in collectives A (comm 0) and B (comm 2), real; ranks 1 and 2
# in V (comm 1) between them, virtual-only. (rank, seq, kind, comm, waits-on-seq, start, end) in ns, as the
# calibrate sweep lays them out: A completes at 200 (last arrival 150 + transfer 50), V at 400 (350 + 50).
SPEC = [
    (0, 0, "compute", -1, -1, 0, 150), (0, 1, "collective", 0, -1, 150, 160), (0, 2, "wait", -1, 1, 160, 200),
    (0, 3, "compute", -1, -1, 200, 440), (0, 4, "collective", 2, -1, 440, 450), (0, 5, "wait", -1, 4, 450, 600),
    (1, 0, "compute", -1, -1, 0, 100), (1, 1, "collective", 0, -1, 100, 110), (1, 2, "wait", -1, 1, 110, 200),
    (1, 3, "compute", -1, -1, 200, 300), (1, 4, "collective", 1, -1, 300, 310), (1, 5, "wait", -1, 4, 310, 400),
    (1, 6, "compute", -1, -1, 400, 450), (1, 7, "collective", 2, -1, 450, 460), (1, 8, "wait", -1, 7, 460, 600),
    (2, 0, "compute", -1, -1, 0, 50), (2, 1, "collective", 0, -1, 50, 60), (2, 2, "wait", -1, 1, 60, 200),
    (2, 3, "compute", -1, -1, 200, 350), (2, 4, "collective", 1, -1, 350, 360), (2, 5, "wait", -1, 4, 360, 400),
    (2, 6, "compute", -1, -1, 400, 420), (2, 7, "collective", 2, -1, 420, 430), (2, 8, "wait", -1, 7, 430, 600),
]
GROUP = {0: "w", 1: "v", 2: "w"}
LIVE = {(r, s) for r in (1, 2) for s in range(2, 8)}  # from the wait on A to the issue of B


def _job(tmp_path, iteration=lambda rank, seq: 0, spec=SPEC):
    ids = {(r, s): i for i, (r, s, *_) in enumerate(spec)}
    comm_of = {(r, s): c for r, s, _, c, *_ in spec}
    rows, tl = [], []
    for i, (rank, seq, kind, comm, on, start, end) in enumerate(spec):
        c = comm if comm >= 0 else (comm_of[(rank, on)] if on >= 0 else -1)
        rows.append(dict(event_id=i, rank=rank, seq=seq, kind=kind, op="compute" if kind == "compute" else "all_reduce",
                         group_name=GROUP.get(c), group_seq={0: 0, 1: 0, 2: 1}.get(c, -1) if kind == "collective" else -1,
                         peer=-1, tag=0, bytes=4, dtype=None, shape=None, is_async=False, work_id=-1,
                         iteration=iteration(rank, seq), microbatch=-1, t_start_ns=start, t_end_ns=end, cpu_ns=0,
                         device_ns=0, t_complete_ns=-1, mem_bytes=-1, mem_peak_bytes=-1, mem_reserved_bytes=-1,
                         stream=0, comm_id=comm, op_event_id=ids[(rank, on)] if on >= 0 else -1))
        tl.append(dict(rank=rank, seq=seq, event_id=i, start_ns=start, end_ns=end))
    (tmp_path / "graph").mkdir()
    (tmp_path / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.EVENTS), tmp_path / "graph" / "events.parquet")
    pq.write_table(pa.Table.from_pylist(tl, schema=schemas.TIMELINE), tmp_path / "calibrated" / "timeline.parquet")
    return tmp_path / "graph" / "events.parquet", tmp_path / "calibrated" / "timeline.parquet"


def _times(replay: TimedReplay) -> dict:
    job = replay.job
    return {(int(job.rank[p]), int(job.seq[p])): (int(s), int(e))
            for p, s, e in zip(replay.live_pos, replay.start, replay.end)}


def test_cone_is_the_events_between_two_real_comms(tmp_path):
    job = cone.load(*_job(tmp_path), sandbox={0})
    assert list(job.real) == [True, False, True] and list(job.xfer) == [50, 50, 150]
    live = {(int(r), int(s)) for r, s in zip(job.rank[job.live], job.seq[job.live])}
    assert live == LIVE and job.cone_size == (12, 18)
    after = {(int(r), int(s)) for r, s in zip(job.rank[job.after], job.seq[job.after])}
    assert after == {(r, s) for r in (1, 2) for s in range(2, 9)}  # the waits on B too: the sweep's part


def test_unchanged_sandbox_gives_the_calibrated_times(tmp_path):
    """Real comm A completes at its calibrated time: every live event, and the virtual arrival at B (what
    the sandbox waits for), is exactly at its calibrated time: the virtual clock adds no wait."""
    replay = TimedReplay(*_job(tmp_path), sandbox={0})
    assert replay.arrival(0) == 100  # rank 1's calibrated arrival (static: before any real comm)
    assert replay.arrival(2) is None  # not known before A completed
    replay.simulate({0: 200, 2: 600})
    assert replay.arrival(2) == 450
    cal = {(r, s): (a, b) for r, s, _, _, _, a, b in SPEC}
    assert _times(replay) == {k: cal[k] for k in LIVE}


def test_a_late_sandbox_delays_the_cone_by_as_much(tmp_path):
    replay = TimedReplay(*_job(tmp_path), sandbox={0})
    replay.simulate({0: 1000, 2: 2000})
    cal = {(r, s): (a, b) for r, s, _, _, _, a, b in SPEC}
    got = _times(replay)
    assert got[(1, 2)] == (110, 1000) and got[(2, 2)] == (60, 1000)  # the waits on A end when A completes
    assert {k: v for k, v in got.items() if k[1] > 2} == {k: (cal[k][0] + 800, cal[k][1] + 800) for k in LIVE
                                                          if k[1] > 2}
    assert replay.arrival(2) == 450 + 800


def test_real_ops_wait_for_the_wall_clock_and_release_the_cone(tmp_path):
    replay = TimedReplay(*_job(tmp_path), sandbox={0})
    t0 = time.monotonic_ns()
    loop = threading.Thread(target=replay.run, args=(t0,))
    loop.start()
    replay.gate(0)
    time.sleep(0.05)  # the sandbox's A takes 50 ms: the cone goes on from then, not from 200 ns
    replay.complete(0)
    replay.gate(2)
    done = int(replay.completion[0])
    assert done >= 50_000_000 and replay.arrival(2) == done + 250
    assert time.monotonic_ns() - t0 >= done + 250
    replay.complete(2)
    loop.join(5)
    assert not loop.is_alive()
    rows = replay.table().to_pylist()
    assert {(r["rank"], r["seq"]) for r in rows} == LIVE
    got = {(r["rank"], r["seq"]): (r["t_start_ns"] - t0, r["t_end_ns"] - t0) for r in rows}
    assert got[(1, 7)] == (done + 250, done + 260) and got[(2, 5)] == (done + 160, done + 200)
    complete = {(r["rank"], r["seq"]): r["t_complete_ns"] - t0 for r in rows if r["kind"] == "collective"}
    assert complete[(1, 4)] == done + 200 and complete[(1, 7)] == int(replay.completion[2])
    stats = replay.stats()
    assert stats["cone_live_events"] == 12 and stats["real_comms_gated"] == 2
    assert stats["gate_late_max_ms"] < 1000  # (the kernel is compiled before t0, never while the sandbox waits)


def test_steps_limit_drives_only_the_first_iterations(tmp_path):
    """B lies in iteration 1: with --steps-limit 1 it is not driven (its gate passes at once) and nothing
    lies between two driven real comms."""
    replay = TimedReplay(*_job(tmp_path, lambda rank, seq: int(seq >= 4 + (rank > 0) * 3)), sandbox={0},
                         steps_limit=1)
    assert replay.driven == {0} and replay.job.cone_size == (0, 14)
    replay.run(time.monotonic_ns())
    started = time.monotonic()
    replay.gate(2)
    assert time.monotonic() - started < 1


def test_progress_reports_each_iteration_once_its_real_comms_completed(tmp_path):
    seen = []
    replay = TimedReplay(*_job(tmp_path, lambda rank, seq: int(seq >= 4 + (rank > 0) * 3)), sandbox={0},
                         progress=lambda k, done, n, t: seen.append((k, done, n, t)))
    replay.feed(0, 1_000_000_000)
    replay.feed(2, 3_000_000_000)
    assert seen == [(0, 1, 2, 1.0), (1, 2, 2, 3.0)]


class _Store:
    def __init__(self):
        self.kv, self.lock = {}, threading.Lock()

    def add(self, key, n):
        with self.lock:
            self.kv[key] = int(self.kv.get(key, 0)) + n
            return self.kv[key]

    def set(self, key, value):
        with self.lock:
            self.kv[key] = value

    def check(self, keys):
        with self.lock:
            return all(k in self.kv for k in keys)

    def get(self, key):
        with self.lock:
            return self.kv[key].encode() if isinstance(self.kv[key], str) else self.kv[key]


def test_common_start_is_the_last_arrival():
    store, got = _Store(), []
    first = threading.Thread(target=lambda: got.append(common_start(store, 2)))
    first.start()
    time.sleep(0.05)
    before = time.monotonic_ns()
    t0 = common_start(store, 2)
    first.join(5)
    assert got == [t0] and t0 >= before


# W=2, sandbox {0}: rank 1 sends m0 to the sandbox (its wait on a send is local), receives m1 from it
# (its wait on the recv blocks), then sends m2.
P2P = [
    (0, 0, "recv", 0, -1, 0, 10), (0, 1, "wait", -1, 0, 10, 100), (0, 2, "compute", -1, -1, 100, 200),
    (0, 3, "send", 1, -1, 200, 210), (0, 4, "wait", -1, 3, 210, 215), (0, 5, "recv", 2, -1, 215, 220),
    (0, 6, "wait", -1, 5, 220, 350),
    (1, 0, "compute", -1, -1, 0, 50), (1, 1, "send", 0, -1, 50, 60), (1, 2, "wait", -1, 1, 60, 70),
    (1, 3, "compute", -1, -1, 70, 80), (1, 4, "recv", 1, -1, 80, 90), (1, 5, "wait", -1, 4, 90, 260),
    (1, 6, "compute", -1, -1, 260, 300), (1, 7, "send", 2, -1, 300, 310),
]


def test_point_to_point_waits_block_only_on_a_recv(tmp_path):
    replay = TimedReplay(*_job(tmp_path, spec=P2P), sandbox={0})
    job = replay.job
    assert {(int(r), int(s)) for r, s in zip(job.rank[job.live], job.seq[job.live])} == {(1, 5), (1, 6), (1, 7)}
    assert job.xfer[1] == 260 - 200  # the recv's wait end - the send's arrival
    assert replay.arrival(0) == 50 and replay.arrival(2) is None
    replay.simulate({0: 100, 1: 500, 2: 700})
    assert _times(replay) == {(1, 5): (90, 500), (1, 6): (500, 540), (1, 7): (540, 550)}
    assert replay.arrival(2) == 540


def test_synthetic_job_arrivals_are_the_calibrated_ones(tmp_path):
    """A synthetic W=16 training job (TP, PP, DP, EP, async DP buckets): with every real op completing at
    its calibrated time, the virtual arrival at every real op is exactly the calibrated one."""
    from prism.bench.emulate import synthetic

    row = synthetic(16, tmp_path)
    assert row["real_comms"] > 100 and 0 < row["cone_live_events"] <= row["virtual_events"]
    assert row["arrivals_off_calibrated"] == 0


def test_a_timeline_without_every_event_is_refused(tmp_path):
    events, timeline = _job(tmp_path)
    pq.write_table(pq.read_table(timeline).slice(0, 5), timeline)
    with pytest.raises(cone.ConeError, match="calibrate the job again"):
        cone.load(events, timeline, {0})
    assert np.iinfo(np.int64).min < cone.NEG


def test_transfer_hold_releases_at_last_arrival_plus_transfer(tmp_path):
    """Emulation's transfer hold: the worker releases a real comm at t0 + its last virtual arrival + its
    calibrated transfer less the real exchange's lead (without the hold: at the last arrival); the sandbox
    gets each real collective's transfer by "<group>/<group_seq>". SPEC's times in units of 0.1 ms: A's
    last virtual arrival 10 ms, its transfer 5 ms; B's transfer 15 ms."""
    scaled = [(r, s, k, c, on, a * 100_000, b * 100_000) for r, s, k, c, on, a, b in SPEC]
    for hold, lead_ms, floor_ms in ((False, 0, 10), (True, 0, 15), (True, 3, 12), (True, 9, 10)):
        (tmp_path / f"{hold}{lead_ms}").mkdir()
        replay = TimedReplay(*_job(tmp_path / f"{hold}{lead_ms}", spec=scaled), sandbox={0})
        assert replay.collective_transfers() == {"w/0": 5_000_000, "w/1": 15_000_000}
        t0 = time.monotonic_ns()
        loop = threading.Thread(target=replay.run, args=(t0,))
        loop.start()
        replay.gate(0, hold=hold, lead_ns=lead_ms * 1_000_000)
        waited_ms = (time.monotonic_ns() - t0) / 1e6
        replay.stop()
        loop.join(5)
        assert floor_ms <= waited_ms < floor_ms + 500, (hold, waited_ms)


def test_each_real_exchange_reports_how_late_it_completed_against_the_model(tmp_path):
    """SPEC's A (real, an all_reduce): virtual arrivals at 100 and 50, calibrated transfer 50, calibrated
    completion 200; completing it ~1 s after t0 is ~1 s late against both; stats() carries it by op."""
    replay = TimedReplay(*_job(tmp_path), sandbox={0})
    replay.stack[:] = np.arange(len(replay.live_ranks))
    replay._step(len(replay.live_ranks))
    assert replay.arrival(0) == 100
    replay.t0_ns = time.monotonic_ns() - 1_000_000_000
    replay.complete(0)
    late = replay.stats()["exchange_late_by_op"]
    assert list(late) == ["all_reduce"] and late["all_reduce"]["n"] == 1
    got = late["all_reduce"]
    assert 1000 - 0.00015 <= got["vs_model_max_ms"] < 1500  # now - (100 + 50 ns)
    assert got["vs_model_max_ms"] - got["vs_calibrated_max_ms"] == pytest.approx(200e-6 - 150e-6, abs=1e-9)
    # the same exchange as the worker writes it (raw/replay/exchanges.arrow, the emulate stage's delays table)
    row = replay.exchanges_table().to_pylist()
    assert len(row) == 1 and replay.exchanges_table().schema.equals(schemas.RAW_EXCHANGES)
    row = row[0]
    assert (row["comm_id"], row["op"], row["iteration"], row["virtual_arrival_ns"], row["transfer_ns"],
            row["calibrated_completion_ns"]) == (0, "all_reduce", 0, 100, 50, 200)
    assert (row["completed_ns"] - 150) / 1e6 == pytest.approx(got["vs_model_max_ms"], abs=1e-9)


def test_no_exchange_completed_is_an_empty_table_of_the_schema(tmp_path):
    table = TimedReplay(*_job(tmp_path), sandbox={0}).exchanges_table()
    assert table.num_rows == 0 and table.schema.equals(schemas.RAW_EXCHANGES)
