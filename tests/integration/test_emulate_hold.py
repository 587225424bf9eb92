"""Mode emulate's transfer hold holds a collective's completion, not the exchanges after it, and not a
native op of sandbox ranks only (`prism/runtime/emulate/works.py`, `EmulateTransport._native`).

A burst of async all-reduces whose calibrated completions differ (the first long, the second short, the
second waited first: DDP's buckets) must complete each at its own calibrated time: while the hold was the
group thread's (and the worker's), the second was exchanged only after the first's hold ended. A native op
of a group of sandbox ranks only (all_gather_into_tensor; and, that group being a pair, its all-reduce SUM:
gloo's own, `native_group._allreduce`) is the job's own op: not held to the calibrated transfer; that
group's all-reduce MAX runs prism's protocol and is held.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import schemas
from tests.conftest import PROGRAMS, run_prism
from tests.integration.test_emulate_mode import _capture, _emulate, _meta, _results

pytestmark = pytest.mark.slow

LONG_S = 1.5  # the calibrated transfer of the first all-reduce and of the pair's ops


def _timeline(events: list[dict]) -> list[dict]:
    """Each rank's events back to back from 0, 1 ms each, but the waits on the first all-reduce (group_seq 0
    of the default group) and on the pair's ops last LONG_S: their transfers are LONG_S, the second's ~3 ms."""
    by_id = {r["event_id"]: r for r in events}
    rows, clock = [], {}
    for r in sorted(events, key=lambda r: (r["rank"], r["seq"])):
        op = by_id.get(r["op_event_id"]) if r["kind"] == "wait" else None
        long = op is not None and (op["group_name"] != "0" or op["group_seq"] == 0)
        start = clock.get(r["rank"], 0)
        end = start + (int(LONG_S * 1e9) if long else 1_000_000)
        rows.append(dict(rank=r["rank"], seq=r["seq"], event_id=r["event_id"], start_ns=start, end_ns=end))
        clock[r["rank"]] = end
    return rows


def test_a_collective_is_held_alone_and_a_native_op_not_at_all(tmp_path):
    job = tmp_path / "job"
    program = [str(PROGRAMS / "held_burst.py")]
    cap = _capture(job, 4, program)
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr[-3000:]
    events = pq.read_table(job / "graph" / "events.parquet").to_pylist()
    mine = sorted((r for r in events if r["rank"] == 0 and r["kind"] == "collective"), key=lambda r: r["seq"])
    assert [(r["group_name"] == "0", r["group_seq"], r["op"]) for r in mine] == [
        (True, 0, "all_reduce"), (True, 1, "all_reduce"), (False, 0, "all_gather_into_tensor"), (False, 1, "all_reduce"),
        (False, 2, "all_reduce")]
    (job / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(_timeline(events), schema=schemas.TIMELINE),
                   job / "calibrated" / "timeline.parquet")
    # sandbox 0 and 1: the default group has virtual members 2 and 3 (one compensator), the pair none
    proc = _emulate(job, 4, "0,1", program, "--devices", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == _results(cap.stdout, {0, 1})  # the values do not depend on the timing
    for rank in (0, 1):
        second_s, first_s, gather_s, reduce_s, max_s = next(map(float, line.split()[2:]) for line in
                                                            proc.stdout.splitlines() if line.startswith(f"timing {rank} "))
        assert first_s >= LONG_S - 0.05, (rank, second_s, first_s)  # held to its calibrated completion
        assert second_s < LONG_S - 0.5, (rank, second_s, first_s)  # not held behind the first
        assert gather_s - first_s < LONG_S - 0.5, (rank, first_s, gather_s)  # native, all sandbox: not held
        assert reduce_s - gather_s < LONG_S - 0.5, (rank, gather_s, reduce_s)  # a pair's SUM: native, not held
        assert max_s - reduce_s >= LONG_S - 0.05, (rank, reduce_s, max_s)  # the protocol's: held
    assert _meta(job)["emulation"]["transfer_holds"] > 0
