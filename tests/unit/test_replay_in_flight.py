"""How many collectives the replay server keeps in flight per group: as many as a real member had issued and
not yet completed at once in the capture (`plan.peak_in_flight`, `ReplayPlan.in_flight`), so that it never
holds back an op the job's own ranks would already have issued (session 12: a fixed bound of 8 held back 4
of dp8-var's 12 EDP all-reduces an iteration, docs/fidelity.md)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.ipc as ipc

from prism import schemas
from prism.runtime.replay.plan import load_plan, peak_in_flight
from tests.unit.rawgen import RawJob
from tests.unit.test_replay import _server, _wait_for


def _columns(job: RawJob, rank: int) -> dict[str, list]:
    return pa.Table.from_pylist(job.events[rank], schema=schemas.RAW_EVENTS).to_pydict()


def _burst(job: RawJob, group: str, n: int, rank: int = 0) -> list[int]:
    """n async all_reduces of `group` issued back to back (DDP's buckets); returns rank's work ids."""
    return [job.collective(group, "all_reduce", 1_024, is_async=True)[rank] for _ in range(n)]


def test_a_burst_is_in_flight_until_the_program_waits_on_it():
    job = RawJob(2)
    dp, tp = job.group("dp", [0, 1], name="dp"), job.group("tp", [0, 1], name="tp")
    for _ in range(2):  # two iterations: 12 bucket all-reduces, a sync TP all-reduce between, then the waits
        works = _burst(job, dp, 12)
        sync = job.collective(tp, "all_reduce", 64)
        job.wait(0, sync[0])
        job.compute(0)
        for w in works:
            job.wait(0, w)
    assert peak_in_flight(_columns(job, 0)) == {"dp": 12, "tp": 1}


def test_a_wait_in_the_middle_of_a_burst_lowers_the_count():
    job = RawJob(2)
    g = job.group("dp", [0, 1], name="g")
    first = _burst(job, g, 3)
    job.wait(0, first[0])  # three out, one waited: a fourth makes three again
    _burst(job, g, 1)
    job.wait(0, first[1])
    job.wait(0, first[2])
    assert peak_in_flight(_columns(job, 0)) == {"g": 3}


def test_an_op_consumed_through_its_future_is_in_flight_until_its_recorded_completion():
    job = RawJob(2)
    g = job.group("dp", [0, 1], name="g")
    _burst(job, g, 2)
    job.events[0][0]["t_complete_ns"] = job.events[0][1]["t_end_ns"]  # done before the third is issued
    job.compute(0)
    _burst(job, g, 1)  # no waits at all: the second never completes as far as the capture knows
    assert peak_in_flight(_columns(job, 0)) == {"g": 2}
    job.events[0][0]["t_complete_ns"] = -1  # nothing says the first completed: all three are out
    assert peak_in_flight(_columns(job, 0)) == {"g": 3}


def _capture_of_a_burst(tmp_path, n: int):
    """A capture of 2 ranks whose group "g" issues n async all-reduces before waiting on any, twice (and a
    group "idle" that never communicates)."""
    job = RawJob(2)
    g = job.group("dp", [0, 1], name="g")
    job.group("pp", [0, 1], name="idle")
    for _ in range(2):
        works = {r: [] for r in (0, 1)}
        for _ in range(n):
            for r, w in job.collective(g, "all_reduce", 1_024, is_async=True).items():
                works[r].append(w)
        for r in (0, 1):
            for w in works[r]:
                job.wait(r, w)
    raw = job.write(tmp_path)
    for r in (0, 1):  # no payloads (the test's issue stands in for gloo)
        with ipc.new_stream(raw / f"rank={r}" / "payloads.arrow", schemas.RAW_PAYLOADS) as writer:
            writer.write_table(schemas.RAW_PAYLOADS.empty_table())
    return tmp_path


def test_the_server_issues_a_whole_burst_of_more_than_eight_before_the_first_completes(tmp_path, monkeypatch):
    plan = load_plan(_capture_of_a_burst(tmp_path, 12), [0])
    assert plan.in_flight == {"g": 12, "idle": 1} and len(plan.collectives["g"]) == 24
    server, done, issued = _server(24, monkeypatch, plan=plan)
    t = threading.Thread(target=server._group, args=("g",), daemon=True)
    t.start()
    assert _wait_for(lambda: len(issued) == 12)  # the burst: all 12 issued, none complete
    assert server.ops == 0
    assert not _wait_for(lambda: len(issued) > 12, timeout=0.3)  # the next iteration's waits for the first
    done[0].set()
    assert _wait_for(lambda: len(issued) == 13 and server.ops == 1)
    for ev in done:
        ev.set()
    t.join(5)
    assert not t.is_alive() and server.ops == 24 and server.errors == []


def test_a_slice_run_prints_the_bound_of_each_group_that_bursts():
    from prism.slices.run import _in_flight

    assert _in_flight({"0": 1, "9": 4, "26": 12}) == " (in flight at most: group 9 4, group 26 12)"
    assert _in_flight({"0": 1}) == "" and _in_flight(None) == ""  # a replay server of an older prism: nothing
