"""Run ids: every artifact carries the run its data comes from, and a stage refuses inputs of two runs."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq

from prism import graph, summary
from prism.slices import plan
from rawgen import megatron_job


def _job(tmp_path, run_id: str = "runa"):
    job = megatron_job(tp=2, dp=2, iterations=2)
    job.run_id = run_id
    job.write(tmp_path)
    return tmp_path


def test_the_run_id_goes_from_meta_json_through_every_stage(tmp_path, capsys):
    job = _job(tmp_path)
    assert graph.main(["--job", str(job)]) == 0
    assert plan.main(["--job", str(job), "--devices", "2"]) == 0
    for path in [*(job / "graph").glob("*.parquet"), job / "slices" / "plan.parquet"]:
        meta = pq.read_schema(path).metadata
        assert meta[b"prism.run_id"] == b"runa" and b"schema_version" in meta, path


def test_graph_of_run_a_with_raw_of_run_b_is_refused(tmp_path, capsys):
    job = _job(tmp_path)
    assert graph.main(["--job", str(job)]) == 0
    for path in (job / "graph").glob("*.parquet"):
        os.utime(path, (1, 1))  # written before the new capture
    meta = job / "raw" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "run_id": "runb"}))
    capsys.readouterr()
    assert summary.main(["--job", str(job)]) == 2
    err = capsys.readouterr().err
    assert "runa" in err and "runb" in err and str(meta) in err and "come from different runs" in err
    assert f"{job / 'graph'}" in err and f"re-run from the stage that writes it (prism graph --job {job})" in err
    assert not (job / "summary.txt").exists()


def test_raw_without_a_run_id_is_refused(tmp_path, capsys):
    job = _job(tmp_path)
    meta = job / "raw" / "meta.json"
    raw = json.loads(meta.read_text())
    del raw["run_id"]
    meta.write_text(json.dumps(raw))
    assert graph.main(["--job", str(job)]) == 2
    err = capsys.readouterr().err
    assert str(meta) in err and "no run id (written by an older prism)" in err
    assert not (job / "graph").exists()


def test_plan_refuses_a_graph_mixed_from_two_runs(tmp_path, capsys):
    a = _job(tmp_path / "a", "runa")
    b = _job(tmp_path / "b", "runb")
    assert graph.main(["--job", str(a)]) == 0 and graph.main(["--job", str(b)]) == 0
    os.replace(b / "graph" / "comms.parquet", a / "graph" / "comms.parquet")
    capsys.readouterr()
    assert plan.main(["--job", str(a), "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert "comms.parquet (run runb)" in err and "events.parquet (run runa)" in err
    assert not (a / "slices").exists()
