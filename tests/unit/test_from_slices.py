"""Durations and transfers from slice runs (`prism.calibrate.from_slices`), on hand-computed values: the
per-slice member delays, each slice run's first member's delay and their mean over the runs (each run on its own clock), and the borrowing of
an unmeasured slice's ranks by rank class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import artifacts, graph, schemas
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_RECV, K_SEND, K_WAIT
from prism.calibrate.from_slices import from_slices, representatives, slice_delays
from prism.calibrate.stage import CalibrateError
from prism.slices.plan import rank_classes
from tests.unit.rawgen import RawJob

# ------------------------------------------------------------------------------------- slice_delays


def _delay_graph():
    """Two ranks: an all_reduce (comm 0) both wait on, a send 0 -> 1 (comm 1), an all_reduce (comm 2)
    consumed through completion stamps, one seen before the other member's issue."""
    #        pos:   0            1       2            3       4       5       6       7            8
    kind = np.array([K_COLLECTIVE, K_WAIT, K_COLLECTIVE, K_WAIT, K_SEND, K_RECV, K_WAIT, K_COLLECTIVE, K_COLLECTIVE,
                     K_COMPUTE])
    comm = np.array([0, -1, 0, -1, 1, 1, -1, 2, 2, -1])
    wait_op = np.array([-1, 0, -1, 2, -1, -1, 5, -1, -1, -1])
    t_start = np.array([100, 110, 150, 160, 400, 380, 390, 600, 700, 0])
    t_end = np.array([110, 300, 160, 250, 410, 390, 500, 610, 710, 50])
    t_complete = np.array([-1, -1, -1, -1, 420, -1, -1, 650, 720, -1])
    return kind, comm, wait_op, t_start, t_end, t_complete


def test_slice_delays_by_hand():
    kind, comm, wait_op, t_start, t_end, t_complete = _delay_graph()
    rank_of = np.array([0, 0, 1, 1, 0, 1, 1, 0, 1, 0])
    total, count = slice_delays(kind, comm, wait_op, t_start, t_end, t_complete, np.arange(len(kind)), 3)
    # comm 0: last issue 150; rank 0 sees it at its wait's end 300 (150), rank 1 at 250 (100)
    # comm 1: last issue max(400, 380) = 400; the send says nothing; the recv's wait ends 500 (100)
    # comm 2: last issue 700; rank 0 completed at 650 (before: clipped to 0), rank 1 at 720 (20)
    assert total.tolist() == [250, 100, 20]
    assert count.tolist() == [2, 1, 2]

    # a slice holding rank 1 only: its own members' last issue (150, 380, 700), its own clock
    total, count = slice_delays(kind, comm, wait_op, t_start, t_end, t_complete, np.flatnonzero(rank_of == 1), 3)
    assert total.tolist() == [100, 120, 20]
    assert count.tolist() == [1, 1, 1]


def test_slice_delays_of_a_timed_slice_start_at_the_replayed_members_issue():
    kind, comm, wait_op, t_start, t_end, t_complete = _delay_graph()
    rank_of = np.array([0, 0, 1, 1, 0, 1, 1, 0, 1, 0])
    # a timed slice of rank 1 only; the replay server issued comm 0 (rank 0's part) at 200 -- after rank 1's
    # own issue at 150 -- and comm 2 at 690 (before rank 1's 700: the slice's own issue stays the last)
    replayed = (np.array([0, 2]), np.array([200, 690]))
    total, count = slice_delays(kind, comm, wait_op, t_start, t_end, t_complete, np.flatnonzero(rank_of == 1), 3,
                                replayed)
    # comm 0: rank 1 sees it at 250: 250 - 200 = 50 (untimed rule: 100, the wait for the late peer included);
    # comm 1 has no replayed issue: 500 - 380 = 120; comm 2: 720 - 700 = 20
    assert total.tolist() == [50, 120, 20]
    assert count.tolist() == [1, 1, 1]


# ------------------------------------------------------------------------------------- from_slices


def _job(tmp_path: Path, markers: list[str], pairs: bool = False) -> Path:
    """4 ranks, 2 iterations of: compute, a marker (its op sets the rank's class), an all_reduce (sync, no
    wait) of all four or, with `pairs`, of ranks {0, 1} and of {2, 3}, iteration_end."""
    job = RawJob(4)
    everyone = job.group("default_pg", [0, 1, 2, 3])
    halves = [job.group("half", [0, 1]), job.group("half", [2, 3])]
    for _ in range(2):
        for r in range(4):
            job.compute(r)
            job.marker(r, markers[r])
        for group in halves if pairs else [everyone]:
            job.collective(group, "all_reduce", 4096)
        for r in range(4):
            job.marker(r, "iteration_end")
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    return tmp_path


def _events(job: Path) -> pl.DataFrame:
    return pl.from_arrow(pq.read_table(job / "graph" / "events.parquet")).with_columns(
        pl.col("kind").cast(pl.Utf8), pl.col("op").cast(pl.Utf8)).sort("rank", "seq")


def _write_plan(job: Path, rows: list[tuple[int, int, str, int]]) -> None:
    """rows: (slice, rank, rank_class, measured_by)."""
    table = pa.table({"slice": [r[0] for r in rows], "rank": [r[1] for r in rows],
                      "rank_class": [r[2] for r in rows], "measured_by": [r[3] for r in rows],
                      "measured": [r[0] == r[3] for r in rows]})
    artifacts.write_parquet(table, job / "slices" / "plan.parquet", schemas.SLICE_PLAN,
                            run_id=artifacts.read_run_id(job / "graph" / "events.parquet"))


def _write_slice(job: Path, k: int, times) -> None:
    """slices/slice=K/events.parquet for the ranks `times` knows: times(rank, seq, kind, iteration) ->
    (device_ns, t_start_ns, t_end_ns, t_complete_ns[, cpu_ns]) (cpu_ns: device_ns unless given, as on CPU)."""
    ev = _events(job)
    rows = {"event_id": [], "device_ns": [], "t_start_ns": [], "t_end_ns": [], "t_complete_ns": [], "cpu_ns": []}
    for e in ev.iter_rows(named=True):
        got = times(e["rank"], e["seq"], e["kind"], e["iteration"])
        if got is None:
            continue
        rows["event_id"].append(e["event_id"])
        for name, value in zip(("device_ns", "t_start_ns", "t_end_ns", "t_complete_ns", "cpu_ns"),
                               tuple(got) + tuple(got[:1]) * (len(got) == 4)):
            rows[name].append(value)
    folder = job / "slices" / f"slice={k}"
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({k: pa.array(v, pa.int64()) for k, v in rows.items()})
    run_id = artifacts.read_run_id(job / "graph" / "events.parquet")
    table = table.replace_schema_metadata({"schema_version": schemas.SCHEMA_VERSION, "prism.run_id": run_id})
    pq.write_table(table, folder / "events.parquet")


def _by_rank_kind(job: Path, durations: pa.Table) -> dict[tuple[int, str], list[int]]:
    ev = _events(job).join(pl.from_arrow(durations), on="event_id")
    out: dict[tuple[int, str], list[int]] = {}
    for e in ev.sort("rank", "seq").iter_rows(named=True):
        out.setdefault((e["rank"], e["kind"]), []).append(e["duration_ns"])
    return out


# hand-chosen slice-run times of the all_reduce: (issue start, completion) per rank and iteration; slice 0
# holds ranks 0 and 1, slice 1 ranks 2 and 3, each on its own clock
ISSUE = {(0, 0): 1000, (1, 0): 1200, (2, 0): 50, (3, 0): 80,
         (0, 1): 5000, (1, 1): 5100, (2, 1): 900, (3, 1): 910}
DONE = {(0, 0): 1500, (1, 0): 1700, (2, 0): 200, (3, 0): 380,
        (0, 1): 5400, (1, 1): 5300, (2, 1): 990, (3, 1): 1110}
COMPUTE = {0: 5000, 1: 7000, 2: 6000, 3: 9000}


def _times(ranks: set[int]):
    def times(rank, seq, kind, iteration):
        if rank not in ranks:
            return None
        if kind == "collective":
            s = ISSUE[rank, iteration]
            return (-1, s, s + 10, DONE[rank, iteration])
        if kind == "compute":
            return (COMPUTE[rank] + iteration, 10 * seq, 10 * seq + 5, -1)
        return (0, 10 * seq, 10 * seq, -1)
    return times


def test_transfer_is_the_mean_over_slice_runs_of_each_runs_first_members_delay(tmp_path):
    job = _job(tmp_path, ["mark"] * 4)
    _write_plan(job, [(0, 0, "a", 0), (0, 1, "a", 0), (1, 2, "a", 1), (1, 3, "a", 1)])
    _write_slice(job, 0, _times({0, 1}))
    _write_slice(job, 1, _times({2, 3}))
    durations, transfers = from_slices(job)
    # iteration 0: slice 0's last issue 1200 -> delays 300, 500: first 300; slice 1's last issue 80 -> 120, 300:
    #   first 120; the mean of the two runs' firsts 210 (session 16's smallest: 120; the untimed rule before
    #   session 16, the mean of all members, 305)
    # iteration 1: slice 0: 5100 -> 300, 200: first 200; slice 1: 910 -> 80, 200: first 80: 140
    assert transfers.sort_by("comm_id").column("transfer_ns").to_pylist() == [210, 140]
    by = _by_rank_kind(job, durations)
    for r in range(4):
        assert by[r, "compute"] == [COMPUTE[r], COMPUTE[r] + 1]  # the slice run's device time
        assert by[r, "collective"] == [10, 10]  # issue time: t_end - t_start


def test_unmeasured_ranks_borrow_by_rank_class_not_by_position(tmp_path):
    # ranks 0 and 3 do one kind of work, 1 and 2 another: slice {2, 3} is equivalent to slice {0, 1}, but
    # in rank order its ranks are (Y, X) where the measured slice's are (X, Y)
    job = _job(tmp_path, ["stage_x", "stage_y", "stage_y", "stage_x"])
    ev = _events(job)
    classes = rank_classes(ev, pl.DataFrame({"rank": [0, 1, 2, 3], "pp": [0, 0, 0, 0]}))
    assert classes[0] == classes[3] != classes[1] == classes[2]
    _write_plan(job, [(0, 0, classes[0], 0), (0, 1, classes[1], 0),
                      (1, 2, classes[2], 0), (1, 3, classes[3], 0)])
    assert representatives(pq.read_table(job / "slices" / "plan.parquet").to_pylist()) == {2: 1, 3: 0}
    _write_slice(job, 0, _times({0, 1}))
    durations, transfers = from_slices(job)
    by = _by_rank_kind(job, durations)
    assert by[3, "compute"] == [COMPUTE[0], COMPUTE[0] + 1]  # rank 3 (class X) takes rank 0's
    assert by[2, "compute"] == [COMPUTE[1], COMPUTE[1] + 1]  # rank 2 (class Y) takes rank 1's
    # only slice 0 measured the all_reduce: delays 300, 500 and 300, 200: the first member's
    assert transfers.sort_by("comm_id").column("transfer_ns").to_pylist() == [300, 200]


def test_a_comm_among_borrowed_ranks_takes_its_representatives_transfer(tmp_path):
    job = _job(tmp_path, ["stage_x", "stage_y", "stage_y", "stage_x"], pairs=True)
    classes = rank_classes(_events(job), pl.DataFrame({"rank": [0, 1, 2, 3], "pp": [0, 0, 0, 0]}))
    _write_plan(job, [(0, 0, classes[0], 0), (0, 1, classes[1], 0),
                      (1, 2, classes[2], 0), (1, 3, classes[3], 0)])
    _write_slice(job, 0, _times({0, 1}))
    _, transfers = from_slices(job)
    comm_of = {(e["rank"], e["iteration"]): e["comm_id"] for e in _events(job).iter_rows(named=True)
               if e["kind"] == "collective"}
    by_id = dict(zip(transfers.column("comm_id").to_pylist(), transfers.column("transfer_ns").to_pylist()))
    # the {0, 1} all_reduce measured in slice 0: iteration 0 delays 300, 500; iteration 1 300, 200
    assert [by_id[comm_of[0, k]] for k in (0, 1)] == [300, 200]
    # the {2, 3} all_reduce ran in no slice; ranks 2 and 3 stand in for 1 and 0: the same comms' transfer
    # (without borrowing it would keep the bare graph's: 0, nobody in the capture waited on it)
    assert [by_id[comm_of[2, k]] for k in (0, 1)] == [300, 200]


def test_representatives_pair_ranks_of_a_class_in_rank_order():
    plan = [{"slice": 0, "rank": r, "rank_class": c, "measured_by": 0} for r, c in
            [(0, "x"), (1, "y"), (2, "x")]] + [
           {"slice": 1, "rank": r, "rank_class": c, "measured_by": 0} for r, c in [(3, "y"), (4, "x"), (5, "x")]]
    assert representatives(plan) == {3: 1, 4: 0, 5: 2}


def test_a_plan_whose_slices_are_not_equivalent_is_refused():
    plan = [{"slice": 0, "rank": 0, "rank_class": "x", "measured_by": 0},
            {"slice": 0, "rank": 1, "rank_class": "y", "measured_by": 0},
            {"slice": 1, "rank": 2, "rank_class": "x", "measured_by": 0},
            {"slice": 1, "rank": 3, "rank_class": "z", "measured_by": 0}]
    with pytest.raises(CalibrateError, match=r"slice 1 has 1 rank\(s\) of class 'z'.*\(0\) has 0.*not equivalent"):
        representatives(plan)


def test_cuda_slices_time_compute_by_the_gpu_clock_not_the_launch_time(tmp_path):
    """A CUDA slice run: a compute event's cpu_ns is the host's time to launch its kernels, its device_ns
    the GPU time (CUDA events); the durations take device_ns. A negative cpu_ns is refused."""
    job = _job(tmp_path, ["mark"] * 4)
    _write_plan(job, [(0, r, "a", 0) for r in range(4)])

    def cuda(rank, seq, kind, iteration):
        got = _times({0, 1, 2, 3})(rank, seq, kind, iteration)
        return got + (40 if kind == "compute" else got[0],)  # 40 ns of CPU time to launch, GPU time 5000+

    _write_slice(job, 0, cuda)
    by = _by_rank_kind(job, from_slices(job)[0])
    for r in range(4):
        assert by[r, "compute"] == [COMPUTE[r], COMPUTE[r] + 1]

    def broken(rank, seq, kind, iteration):
        got = _times({0, 1, 2, 3})(rank, seq, kind, iteration)
        return got + (-7 if (rank, kind) == (2, "compute") else got[0],)

    _write_slice(job, 0, broken)
    with pytest.raises(CalibrateError, match=r"negative duration"):
        from_slices(job)


def test_a_timed_pass_takes_the_first_members_delay_and_keeps_each_members_lag(tmp_path):
    """With the replayed members' issues known (a timed slice's replay.parquet), the measured-run rule
    (`durations.measured_run`): a comm's transfer is its first member's delay, from the last issue replayed
    ones included; a later member's lag is its own time (here the all_reduce has no wait: the lag is in no
    event, only the transfer shows); compute takes the longer of its wall span and device time."""
    job = _job(tmp_path, ["mark"] * 4)
    _write_plan(job, [(0, 0, "a", 0), (0, 1, "a", 0), (1, 2, "a", 1), (1, 3, "a", 1)])
    _write_slice(job, 0, _times({0, 1}))
    _write_slice(job, 1, _times({2, 3}))
    comms = sorted({e["comm_id"] for e in _events(job).iter_rows(named=True) if e["kind"] == "collective"})
    run_id = artifacts.read_run_id(job / "graph" / "events.parquet")
    for k, issues in ((0, [1300, 5150]), (1, [60, 905])):  # slice 0's replayed peers issued last in iteration 0
        folder = job / "slices" / f"slice={k}"
        (folder.parent.parent / "slices_timed" / f"slice={k}").mkdir(parents=True, exist_ok=True)
        for name in ("events.parquet",):
            (job / "slices_timed" / f"slice={k}" / name).write_bytes((folder / name).read_bytes())
        artifacts.write_parquet(pa.table({"comm_id": pa.array(comms, pa.int64()),
                                          "t_issue_ns": pa.array(issues, pa.int64())}),
                                job / "slices_timed" / f"slice={k}" / "replay.parquet", schemas.SLICE_REPLAY,
                                run_id=run_id)
    durations, transfers = from_slices(job, "slices_timed")
    # iteration 0: slice 0's last issue max(1200, 1300) -> delays 200, 400; slice 1's 80 -> 120, 300: firsts
    #   200 and 120, their mean 160
    # iteration 1: slice 0's 5150 -> 250, 150; slice 1's 910 -> 80, 200: firsts 150 and 80: 115
    assert transfers.sort_by("comm_id").column("transfer_ns").to_pylist() == [160, 115]
    by = _by_rank_kind(job, durations)
    for r in range(4):
        assert by[r, "compute"] == [COMPUTE[r], COMPUTE[r] + 1]  # device time > its 5 ns span


def test_a_member_measured_in_another_slice_run_keeps_no_lag_behind_that_run(tmp_path):
    """A 2-member all_reduce whose members ran in different slice runs (session 17, tp2dp4's TP pairs): each
    run measured its own member's delay, an independent sample of the one completion of the real job. The
    transfer is their mean and neither member's wait holds the other run's difference as a lag (session 16
    took the smaller delay, 100, and gave rank 1's wait the 800 ns excess: the sweep then waited for the
    slower of two samples at every op)."""
    job = RawJob(2)
    pair = job.group("tp", [0, 1])
    for _ in range(2):
        for r in range(2):
            job.compute(r)
        works = job.collective(pair, "all_reduce", 4096)
        for r in range(2):
            job.wait(r, works[r])
            job.marker(r, "iteration_end")
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    _write_plan(tmp_path, [(0, 0, "a", 0), (1, 1, "a", 1)])
    delay = {0: 100, 1: 900}  # each run: its member's issue at 1000 + 100 * seq, completion seen `delay` later

    def times(rank):
        def at(r, seq, kind, iteration):
            if r != rank:
                return None
            t = 1000 * (iteration + 1) + 100 * seq
            if kind == "collective":
                return (-1, t, t + 10, -1)
            if kind == "wait":  # started 20 ns after the issue ended, ends when the member saw the completion
                s = 1000 * (iteration + 1) + 100 * (seq - 1)
                return (-1, s + 30, s + delay[rank], -1)
            return (5000, t, t + 5, -1)
        return at

    _write_slice(tmp_path, 0, times(0))
    _write_slice(tmp_path, 1, times(1))
    durations, transfers = from_slices(tmp_path)
    assert transfers.sort_by("comm_id").column("transfer_ns").to_pylist() == [500, 500]
    by = _by_rank_kind(tmp_path, durations)
    assert by[0, "wait"] == [0, 0] and by[1, "wait"] == [0, 0]  # each its own run's first member: no lag
