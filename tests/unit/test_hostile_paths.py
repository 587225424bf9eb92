"""Paths are data, never code: a job folder whose name is a SQL injection, or holds a quote, a space and a
non-ASCII letter, goes through every stage and command that takes a path, and nothing but the artifacts is
written (issue 23: `prism summary` pasted paths into SQL)."""

from __future__ import annotations

import json
import shlex

import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pyarrow.compute as pc
import pytest

from prism import artifacts, graph, schemas, summary
from prism import sql as prism_sql
from prism.calibrate import from_slices, stage
from prism.report import export
from prism.report import stage as report_stage
from prism.slices import plan
from rawgen import megatron_job

INJECTION = "x.parquet'); COPY (SELECT 42 AS pwned) TO 'injected.csv'; SELECT ('"
NAMES = {"injection": INJECTION, "quote space non-ascii": "res sp ü'q", "double quote": 'a"b; --'}


def _slice_events(folder):
    """Each slice's events: the graph's own rows of the slice's ranks (a slice run's output, without the run)."""
    run_id = artifacts.read_run_id(folder / "graph" / "events.parquet")
    events = artifacts.read_parquet(folder / "graph" / "events.parquet")
    layout = artifacts.read_parquet(folder / "slices" / "plan.parquet").to_pylist()
    for k in sorted({row["slice"] for row in layout}):
        ranks = [row["rank"] for row in layout if row["slice"] == k]
        part = events.filter(pc.is_in(events["rank"], value_set=pa.array(ranks, pa.int32())))
        artifacts.write_outputs(folder / "slices" / f"slice={k}", {"events": part},
                                {"events": schemas.SLICE_EVENTS}, run_id=run_id)


@pytest.mark.parametrize("mode", ["real", "capture"])  # the summary reads other files of a capture
@pytest.mark.parametrize("name", list(NAMES))
def test_every_stage_takes_a_hostile_path_as_data(tmp_path, monkeypatch, capsys, name, mode):
    monkeypatch.chdir(tmp_path)  # where a relative COPY ... TO would land
    folder = tmp_path / NAMES[name]
    pa.parquet.write_table(pa.table({"a": [1]}), tmp_path / "x.parquet")  # what the pasted path would read
    megatron_job(tp=2, dp=2, iterations=3).write(folder)
    meta = json.loads((folder / "raw" / "meta.json").read_text())
    (folder / "raw" / "meta.json").write_text(json.dumps({**meta, "mode": mode, "devices": 2}))
    job = ["--job", str(folder)]
    assert graph.main(job) == 0
    assert plan.main(job + ["--devices", "2"]) == 0
    _slice_events(folder)
    assert from_slices.main(job) == 0
    assert stage.main(job + ["--durations", str(folder / "slices" / "durations.parquet")]) == 0
    code = summary.main(job)
    assert not list(tmp_path.rglob("injected.csv")), "the path was run as SQL"
    assert code == 0, capsys.readouterr().err
    assert "ranks: 4" in (folder / "summary.txt").read_text()
    if mode == "capture":
        assert "PREDICTED iteration time" in (folder / "summary.txt").read_text()
    assert shlex.split((folder / "summary.txt").read_text().splitlines()[-1])[4] == str(folder)  # pastes back
    assert prism_sql.main(job + ["SELECT count(*) AS n FROM ranks"]) == 0
    assert prism_sql.main(job + ["--write-catalog", "SELECT count(*) AS n FROM capture.events"]) == 0
    assert report_stage.main(job) == 0, capsys.readouterr().err
    assert export.main(job + ["--timeline", "calibrated", "--format", "perfetto",
                              "--out", str(folder / "trace.json")]) == 0, capsys.readouterr().err
    leaked = list(tmp_path.rglob("injected.csv"))
    assert not leaked, leaked
