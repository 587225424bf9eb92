"""`prism.bench.fidelity_hold.breakdown`: where an emulated sandbox rank's iterations differ from the
calibrated timeline, on a hand-made job (times in ms)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.bench.fidelity_hold import breakdown

MS = 1_000_000
COLS = ["event_id", "rank", "seq", "kind", "op", "group", "iteration", "comm_id", "op_event_id", "start_ns",
        "end_ns", "source"]


def _job(tmp_path):
    """Ranks 0 (sandbox) and 1 (replayed), 3 iterations of: compute, all_reduce issue, wait, iteration_end.
    Emulated per iteration k (from 10k): rank 0 computes 0-4, issues at 4, waits 4.5-9 (it ends 1 ms past
    the model: last arrival 5 (rank 1) + transfer 3 = 8); rank 1 issues at 5. Calibrated: the compute
    lasts 3, the wait 2."""
    rows, tl, eid = [], [], 0
    for it in range(3):
        b = 10 * it
        for rank, events in ((0, [("compute", "compute", None, -1, 0, 4), ("collective", "all_reduce", "7", it, 4, 4.5),
                                  ("wait", "all_reduce", "7", -1, 4.5, 9), ("marker", "iteration_end", None, -1, 9, 10)]),
                             (1, [("collective", "all_reduce", "7", it, 5, 5.5)])):
            for k, (kind, op, group, comm, s, e) in enumerate(events):
                seq = 4 * it + k
                op_event = eid - 1 if kind == "wait" else -1
                rows.append([eid, rank, seq, kind, op, group, it, comm, op_event, int((b + s) * MS), int((b + e) * MS),
                             "sandbox" if rank == 0 else "replay"])
                pred = {"compute": 3, "wait": 2}.get(kind, e - s)
                tl.append(dict(rank=rank, seq=seq, event_id=eid, start_ns=int((b + s) * MS),
                               end_ns=int((b + s + pred) * MS)))
                eid += 1
    (tmp_path / "emu").mkdir()
    pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(COLS)}), tmp_path / "emu" / "events.parquet")
    (tmp_path / "calibrated").mkdir()
    pq.write_table(pa.Table.from_pylist(tl), tmp_path / "calibrated" / "timeline.parquet")
    (tmp_path / "graph").mkdir()
    pq.write_table(pa.table({"comm_id": [0, 1, 2]}), tmp_path / "graph" / "comms.parquet")
    (tmp_path / "slices").mkdir()
    pq.write_table(pa.table({"comm_id": [0, 1, 2], "transfer_ns": [3 * MS] * 3}),
                   tmp_path / "slices" / "transfers.parquet")
    return tmp_path


def test_breakdown_per_op_and_past_the_model(tmp_path):
    out = breakdown(_job(tmp_path), "emu", 0)
    assert out["iterations"] == 1  # iterations 1 .. last-1: iteration 1 only
    spent = out["spent"]
    assert spent["compute"]["sandbox_ms"] == pytest.approx(4) and spent["compute"]["pred_ms"] == pytest.approx(3)
    assert spent["wait all_reduce group 7"]["excess_ms"] == pytest.approx(4.5 - 2)
    assert spent["wait all_reduce group 7"]["n"] == 1
    late = out["late_ms"]["all_reduce group 7"]
    assert late["sum_ms"] == pytest.approx(1) and late["median_ms"] == pytest.approx(1)
