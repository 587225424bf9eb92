"""Mode emulate's transfer hold holds a collective's completion, not the exchanges after it.

A burst of async all-reduces whose calibrated completions differ (the first long, the second short, the
second waited first: DDP's buckets) must complete each at its own calibrated time: before the hold left
the group's thread (and the worker's), the second was exchanged only after the first's hold ended, so every
op of a burst completed one exchange after the one before (`prism/runtime/emulated_works.py`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import schemas
from tests.conftest import PROGRAMS, run_prism
from tests.integration.test_emulate_mode import _capture, _emulate, _meta, _results

pytestmark = pytest.mark.slow

LONG_S = 1.5  # the first all-reduce's calibrated transfer
# each rank's calibrated events (ms): compute, issue A, compute, issue B, compute, wait B (B's transfer 8 ms),
# compute, wait A (ends LONG_S after A's arrival)
TIMES_MS = [(0, 10), (10, 11), (11, 12), (12, 13), (13, 14), (14, 20), (20, 21), (21, 10 + LONG_S * 1000)]


def test_a_collective_is_not_held_behind_the_one_before(tmp_path):
    job = tmp_path / "job"
    program = [str(PROGRAMS / "held_burst.py")]
    cap = _capture(job, 2, program)
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr[-3000:]
    events = sorted(pq.read_table(job / "graph" / "events.parquet").to_pylist(), key=lambda r: (r["rank"], r["seq"]))
    assert [(r["kind"], r["group_seq"]) for r in events if r["rank"] == 0 and r["kind"] == "collective"] == \
        [("collective", 0), ("collective", 1)]
    waits = [r["op_event_id"] for r in events if r["rank"] == 0 and r["kind"] == "wait"]
    ids = {r["event_id"]: r["group_seq"] for r in events}
    assert [ids[w] for w in waits] == [1, 0] and len(events) == 2 * len(TIMES_MS)  # B waited first, then A
    rows = [dict(rank=r["rank"], seq=r["seq"], event_id=r["event_id"], start_ns=int(a * 1e6), end_ns=int(b * 1e6))
            for r, (a, b) in zip(events, TIMES_MS * 2)]
    (job / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.TIMELINE), job / "calibrated" / "timeline.parquet")
    proc = _emulate(job, 2, "0", program)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == _results(cap.stdout, {0})  # the values do not depend on the timing
    second_s, first_s = next(map(float, line.split()[2:]) for line in proc.stdout.splitlines()
                             if line.startswith("timing 0 "))
    assert first_s >= LONG_S - 0.05, (second_s, first_s)  # A is held to its calibrated completion
    assert second_s < LONG_S - 0.5, (second_s, first_s)  # B is not held behind A
    assert _meta(job)["emulation"]["transfer_holds"] > 0
