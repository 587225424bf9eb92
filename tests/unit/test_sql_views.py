"""The views `prism sql` derives (prism/sql_views.py) on a job holding a capture graph, its calibration (with
the critical path) and a baseline graph: their columns and values against the artifacts, no SQL keyword as a
column name, and the README's three queries (critical-path rank, idle per pipeline stage, prediction against
the baseline per rank) running as written."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from prism import graph, sql
from prism.calibrate import stage
from rawgen import megatron_job

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("views") / "tiny"
    megatron_job(tp=2, dp=2, iterations=3).write(folder)
    assert graph.main(["--job", str(folder)]) == 0
    assert stage.main(["--job", str(folder)]) == 0
    megatron_job(tp=2, dp=2, iterations=3).write(folder / "baseline")
    assert graph.main(["--job", str(folder / "baseline")]) == 0
    return folder


def rows(job: Path, query: str) -> list[tuple]:
    columns, result, skipped = sql.run_query(job, query)
    assert skipped == {}
    return [dict(zip(columns, r)) for r in result]


def test_calibrated_events_join_the_timeline_with_the_graph(job):
    got = rows(job, "SELECT * FROM calibrated.events ORDER BY rank, seq")
    timeline = pq.read_table(job / "calibrated" / "timeline.parquet").to_pylist()
    events = {e["event_id"]: e for e in pq.read_table(job / "graph" / "events.parquet").to_pylist()}
    assert len(got) == len(timeline)
    ranks = {r["rank"]: r for r in pq.read_table(job / "graph" / "ranks.parquet").to_pylist()}
    for g, t in zip(got, sorted(timeline, key=lambda t: (t["rank"], t["seq"]))):
        e = events[t["event_id"]]
        assert (g["start_ns"], g["end_ns"], g["kind"], g["op"], g["group_name"]) == (
            t["start_ns"], t["end_ns"], e["kind"], e["op"], e["group_name"])
        assert (g["tp"], g["dp"]) == (ranks[g["rank"]]["tp"], ranks[g["rank"]]["dp"])
        assert g["idle_ns"] is None  # no slice runs: the calibration's own durations are not known
    named = {g["group_label"] for g in got if g["group_name"] is not None}
    assert named and all(re.fullmatch(r"[\w ]+\[\d+(,\d+)*\]", n) for n in named), named


def test_no_sql_keyword_is_a_derived_view_column(job):
    reserved = {k for (k,) in duckdb.sql("SELECT keyword_name FROM duckdb_keywords() "
                                         "WHERE keyword_category = 'reserved'").fetchall()}
    assert {"group", "desc", "order", "end"} <= reserved
    for view in ("calibrated.events", "calibrated.idle", "baseline.iterations", "capture.group_labels",
                 "capture.events", "capture.groups", "capture.comms"):
        columns, _, _ = sql.run_query(job, f"SELECT * FROM {view} LIMIT 0")
        assert not ({"start"} | reserved) & {c.lower() for c in columns}, (view, columns)


def test_baseline_iterations_as_the_calibrated_ones(job):
    got = rows(job, "SELECT * FROM baseline.iterations ORDER BY rank, iteration")
    cal = pq.read_table(job / "calibrated" / "iterations.parquet")
    assert [(r["rank"], r["iteration"]) for r in got] == list(zip(cal["rank"].to_pylist(), cal["iteration"].to_pylist()))
    ev = pq.read_table(job / "baseline" / "graph" / "events.parquet").to_pylist()
    t0 = min(e["t_start_ns"] for e in ev)
    ends = sorted((e["rank"], e["iteration"], e["t_end_ns"] - t0) for e in ev if e["op"] == "iteration_end")
    assert [(r["rank"], r["iteration"], r["end_ns"]) for r in got] == ends
    assert all(r["duration_ns"] == r["end_ns"] - r["start_ns"] > 0 for r in got)


def test_idle_without_slice_runs_is_null_and_critical_path_is_an_artifact(job):
    idle = rows(job, "SELECT * FROM calibrated.idle")
    assert idle and all(r["idle_ns"] is None and r["span_ns"] > 0 for r in idle)
    path = rows(job, "SELECT iteration, count(*) AS n FROM calibrated.critical_path GROUP BY 1 ORDER BY 1")
    assert [r["iteration"] for r in path] == [0, 1, 2] and all(r["n"] > 0 for r in path)


def test_idle_is_the_part_of_a_wait_beyond_its_own_duration(job, tmp_path):
    import shutil

    import pyarrow as pa

    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    tl = pq.read_table(copy / "calibrated" / "timeline.parquet")
    span = {e: b - a for e, a, b in zip(*(tl[c].to_pylist() for c in ("event_id", "start_ns", "end_ns")))}
    own = {e: d // 2 for e, d in span.items()}  # a hand-made durations table: every event half its span
    table = pa.table({"event_id": list(own), "duration_ns": list(own.values())})
    (copy / "slices").mkdir(exist_ok=True)
    pq.write_table(table, copy / "slices" / "durations.parquet")
    got = rows(copy, "SELECT event_id, kind, idle_ns FROM calibrated.events")
    assert got and all(r["idle_ns"] == (span[r["event_id"]] - own[r["event_id"]] if r["kind"] == "wait" else 0)
                       for r in got)
    per_rank = rows(copy, "SELECT rank, sum(idle_ns) AS idle FROM calibrated.idle GROUP BY rank")
    assert sum(r["idle"] for r in per_rank) == sum(r["idle_ns"] for r in got)


def test_the_readme_queries_answer(job, capsys):
    block = re.search(r"Three questions.*?```sh\n(.*?)```", README.read_text(), re.S).group(1)
    queries = re.findall(r'prism sql --job results/tiny "\n(.*?)"\n', block, re.S)
    capsys.readouterr()
    out = []
    for query in queries:
        assert sql.main(["--job", str(job), "--csv", query]) == 0
        out.append(list(csv.reader(io.StringIO(capsys.readouterr().out))))
    critical, idle, per_rank = out
    assert critical[0] == ["rank", "events", "ms_on_path"] and len(critical) > 1
    assert idle[0] == ["pp", "ranks", "idle_ms", "idle_pct"] and len(idle) == 2  # one pipeline stage
    assert per_rank[0] == ["rank", "predicted_ms", "measured_ms"] and len(per_rank) == 1 + 4
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in per_rank[1:])
