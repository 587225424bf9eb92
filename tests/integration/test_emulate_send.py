"""The timed emulation ends a sandbox rank's waits as the calibrated model does (`prism.clock_rule`):

- a send completes for the program at once (a wait on a send is its own time only), not when its receiver
  posts the recv, which is when a gloo send completes (`prism/runtime/emulate/works.py` `SendQueue`; session
  17 in `docs/fidelity.md`: the pipeline configs' sends waited for the next stage's arrival, up to 36.6 ms an
  iteration past the model);
- a wait on a held collective ends its calibrated own time after the later of its call and the completion
  (`wait_ends`: a member's lag), not at the completion (`EmuWork`, `TimedReplay.wait_owns`);
- that completion is a transfer after the last arrival of any member, another sandbox member's included (the
  sandbox participants exchange their arrivals: `transport.ARRIVAL_TAG`), not after the rank's own arrival
  or the virtual members' last.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import schemas
from tests.conftest import PROGRAMS, run_prism
from tests.integration.test_emulate_mode import _capture, _emulate, _results

pytestmark = pytest.mark.slow


LATE_S = 1.0  # tests/programs/late_recv.py's
LAG_S = 1.5  # rank 1's calibrated own time on the all-reduce


def _timeline(events: list[dict], lag_s: float = 0.0) -> list[dict]:
    """Each rank's events back to back from 0, 1 ms each (the sends' waits too: the model's local send), but
    rank 2's compute before its recv (its sleep) lasts 2 LATE_S: its recv's calibrated arrival, which the
    worker keeps (it posts the virtual rank's recv then); with `lag_s`, rank 1's wait on the all-reduce ends
    `lag_s` after the others' (its own time: a lagging member)."""
    rows, clock = [], {}
    mine = sorted((r for r in events if r["rank"] == 2), key=lambda r: r["seq"])
    recv = next(r["seq"] for r in mine if r["kind"] == "recv")
    sleep = max(r["seq"] for r in mine if r["seq"] < recv and r["kind"] == "compute")
    by_id = {r["event_id"]: r for r in events}
    for r in sorted(events, key=lambda r: (r["rank"], r["seq"])):
        start = clock.get(r["rank"], 0)
        long = r["rank"] == 2 and r["seq"] == sleep
        op = by_id.get(r["op_event_id"]) if r["kind"] == "wait" else None
        lag = op is not None and op["kind"] == "collective" and r["rank"] == 1
        # every member's wait ends at the same time (the last arrival, rank 2 at ~2 s, + 1 ms), rank 1's lag_s later
        end = start + (int(2 * LATE_S * 1e9) if long else 1_000_000)
        if op is not None and op["kind"] == "collective":
            end = max(end, int(2 * LATE_S * 1e9) + 100_000_000) + (int(lag_s * 1e9) if lag else 0)
        rows.append(dict(rank=r["rank"], seq=r["seq"], event_id=r["event_id"], start_ns=start, end_ns=end))
        clock[r["rank"]] = end
    return rows


def _timeline_last_sandbox(events: list[dict], xfer_s: float) -> list[dict]:
    """Each rank's events back to back, 1 ms each, but rank 1's sleep (LATE_S, before its recv): the last
    arrival at the all-reduce is rank 1, a sandbox rank, and every member's wait on it ends `xfer_s` after."""
    rows, clock = [], {}
    by_id = {r["event_id"]: r for r in events}
    one = sorted((r for r in events if r["rank"] == 1), key=lambda r: r["seq"])
    recv = next(r["seq"] for r in one if r["kind"] == "recv")
    sleep = max(r["seq"] for r in one if r["seq"] < recv and r["kind"] == "compute")
    arrive = {}
    for r in sorted(events, key=lambda r: (r["rank"], r["seq"])):
        start = clock.get(r["rank"], 0)
        end = start + (int(LATE_S * 1e9) if (r["rank"], r["seq"]) == (1, sleep) else 1_000_000)
        if r["kind"] == "collective":
            arrive[r["rank"]] = start
        rows.append(dict(rank=r["rank"], seq=r["seq"], event_id=r["event_id"], start_ns=start, end_ns=end))
        clock[r["rank"]] = end
    done = max(arrive.values()) + int(xfer_s * 1e9)
    clock = {}
    for row, r in zip(rows, sorted(events, key=lambda r: (r["rank"], r["seq"]))):  # again, the waits at `done`
        op = by_id.get(r["op_event_id"]) if r["kind"] == "wait" else None
        start = clock.get(r["rank"], row["start_ns"])
        end = start + (row["end_ns"] - row["start_ns"])
        if op is not None and op["kind"] == "collective":
            end = max(start, done) + 100_000
        row["start_ns"], row["end_ns"] = start, end
        clock[r["rank"]] = end
    return rows


def _job(tmp_path, lag_s: float, timeline=None):
    job = tmp_path / "job"
    program = [str(PROGRAMS / "late_recv.py")]
    cap = _capture(job, 3, program)
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr[-3000:]
    events = pq.read_table(job / "graph" / "events.parquet").to_pylist()
    (job / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(timeline(events) if timeline else _timeline(events, lag_s),
                                        schema=schemas.TIMELINE),
                   job / "calibrated" / "timeline.parquet")
    proc = _emulate(job, 3, "0,1", program, "--devices", "2")  # rank 2 virtual: the worker's recv, at ~2 s
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cap, proc


def test_a_lagging_member_waits_its_own_time_past_the_completion(tmp_path):
    cap, proc = _job(tmp_path, LAG_S)
    assert _results(proc.stdout) == _results(cap.stdout, {0, 1})
    done = {int(line.split()[1]): float(line.split()[2]) for line in proc.stdout.splitlines()
            if line.startswith("reduced ")}
    assert done[1] - done[0] >= LAG_S - 0.15, done  # rank 1's wait: its own time after the completion
    assert done[1] - done[0] <= LAG_S + 0.5, done


def test_a_held_collective_counts_the_other_sandbox_members_arrivals(tmp_path):
    """Rank 1 (sandbox) arrives last, LATE_S after rank 0; the model completes the all-reduce XFER_S after
    that: rank 0's wait too, not XFER_S after its own arrival (nor the virtual rank 2's)."""
    xfer_s = 1.0
    cap, proc = _job(tmp_path, 0.0, lambda events: _timeline_last_sandbox(events, xfer_s))
    assert _results(proc.stdout) == _results(cap.stdout, {0, 1})
    done = {int(line.split()[1]): float(line.split()[2]) for line in proc.stdout.splitlines()
            if line.startswith("reduced ")}
    assert abs(done[1] - done[0]) < 0.3, done  # both at rank 1's arrival + the transfer


def test_a_send_to_a_late_receiver_completes_at_once(tmp_path):
    cap, proc = _job(tmp_path, 0.0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == _results(cap.stdout, {0, 1})  # what rank 1 received is what was sent
    to_1, to_2 = next(map(float, line.split()[2:]) for line in proc.stdout.splitlines() if line.startswith("timing 0 "))
    # the model's local sends, not gloo's rendezvous with the receivers' recvs (~1 s each)
    assert to_1 < 0.3, (to_1, to_2)  # a sandbox receiver
    assert to_2 < 0.3, (to_1, to_2)  # a virtual one
