"""`prism.bench.fidelity_hold.breakdown`: where an emulated sandbox rank's iterations differ from the
calibrated timeline, on a hand-made job (times in ms)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.bench.fidelity_hold import breakdown

MS = 1_000_000
COLS = ["event_id", "rank", "seq", "kind", "op", "group_name", "iteration", "comm_id", "op_event_id", "start_ns",
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


def test_by_kind_sums_the_groups_of_each_kind_and_op(tmp_path):
    b = breakdown(_job(tmp_path), "emu", 0)["by_kind"]
    assert b["compute"]["excess_ms"] == pytest.approx(1)  # 4 measured against 3 calibrated
    assert b["wait all_reduce"]["excess_ms"] == pytest.approx(2.5) and b["wait all_reduce"]["n"] == 1
    assert b["collective all_reduce"]["excess_ms"] == pytest.approx(0)  # the issue lasts what the timeline says


def test_env_after_and_run_names():
    from prism.bench.fidelity_hold import parse_env, run_name

    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_env(["A"])
    assert [run_name("before", i) for i in range(3)] == ["before", "before2", "before3"]


def test_summary_takes_the_median_over_repeats():
    from prism.bench.fidelity_hold import summary

    def run(gap, excess):
        return {"sandbox_minus_pred_pct": gap, "sandbox_ms": 100 + gap, "pred_rank_ms": 100.0,
                "sandbox_minus_computed_pct": gap / 2,
                "breakdown": {"by_kind": {"compute": {"n": 2, "sandbox_ms": 50 + excess, "pred_ms": 50,
                                                      "excess_ms": excess}}}}

    res = {"runs": {"before": [run(10, 4), run(12, 6), run(8, 5)], "after": [run(2, 1), {"error": "x"}, run(4, 3)]}}
    text = "\n".join(summary(res))
    assert "before: sandbox - predicted +10.0 %" in text and "after: sandbox - predicted +3.0 %" in text
    assert "excess    +5.00 ms/it" in text and "excess    +2.00 ms/it" in text
    assert "sandbox - computed +5.0 % (runs: +5.0, +6.0, +4.0)" in text and "sandbox - computed +1.5 %" in text


def test_compute_cpu_time_beside_its_wall(tmp_path):
    job = _job(tmp_path)
    assert breakdown(job, "emu", 0)["compute_cpu_ms"] is None  # no cpu_ns column: not known
    path = job / "emu" / "events.parquet"
    t = pq.read_table(path)
    kinds = t.column("kind").to_pylist()
    # compute used 2.5 ms of CPU in its 4 ms wall span; other events' CPU is not compute's
    pq.write_table(t.append_column("cpu_ns", pa.array([int(2.5 * MS) if k == "compute" else 7 * MS for k in kinds])),
                   path)
    assert breakdown(job, "emu", 0)["compute_cpu_ms"] == pytest.approx(2.5)


def test_docs_local_session_8_figures_are_what_show_prints():
    """The table of docs/fidelity.md "Local, session 8" is what `fidelity_hold --show` prints from the
    committed JSON: each row's runs and medians, before and after."""
    import json
    import re
    from pathlib import Path

    from prism.bench.fidelity_hold import report

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "fidelity.md").read_text().split("## Local, session 8")[1].split("\n## ")[0]
    rows = [line for line in doc.splitlines() if re.match(r"\| [a-z0-9-]+, ranks? [\d,]+ \| [\d.]+ -> [\d.]+ \|", line)]
    assert len(rows) == 3, rows
    for line in rows:
        config = line.split("|")[1].split(",")[0].strip()
        which = "rank" if ", rank " in line else "slice"
        path = root / "docs" / "results" / "fidelity" / "local-s8" / f"{config}-{which}.json"
        out = report(json.loads(path.read_text()))
        cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        before_runs, before_med, before_comp, after, after_comp = cells[2], cells[3], cells[4], cells[5], cells[6]
        after_med, after_runs = after.split(" (")[0], after.split(" (")[1].rstrip(")")
        assert f"before: sandbox - predicted {before_med} % (runs: {before_runs};" in out, (config, before_med)
        assert f"after: sandbox - predicted {after_med} % (runs: {after_runs};" in out, (config, after_med)
        assert re.search(rf"before: sandbox - predicted .*sandbox - computed {re.escape(before_comp)} %", out)
        assert re.search(rf"after: sandbox - predicted .*sandbox - computed {re.escape(after_comp)} %", out)
