"""Workflow level: the job folder. One that holds another run (what `prism launch --out` writes: raw/ at its top)
is refused before any rule writes into it, naming the folder and the fix; a copied job folder works from its new
place."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from tests.conftest import data_path
from tests.workflow.runs import snakemake, tiny_args


def _listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_a_folder_holding_another_run_is_refused_before_anything_is_written(tmp_path):
    job = tmp_path / "tiny"
    (job / "raw").mkdir(parents=True)
    (job / "raw" / "meta.json").write_text(json.dumps({"run_id": "f00dfeed", "nproc": 2}))
    (job / "graph").mkdir()
    before = _listing(tmp_path)
    proc = snakemake(*tiny_args(tmp_path))  # a real run, not a dry run: it must stop before any rule
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"{job} holds another run" in out and "f00dfeed" in out, out
    assert "Fix:" in out and "job=NAME" in out, out
    assert "rule capture" not in out and "baseline_decision" not in out.split("holds another run")[0], out
    assert _listing(tmp_path) == before, "the refusal wrote into the folder"


def test_a_folder_of_this_pipeline_is_not_refused(tmp_path):
    (tmp_path / "tiny" / "capture").mkdir(parents=True)  # what an interrupted pipeline leaves: its own folders
    proc = snakemake(*tiny_args(tmp_path), "-n")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_copied_job_folder_works_from_its_new_place(tiny_reference, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(tiny_reference, moved / "tiny", symlinks=True)  # (mtimes kept, as `cp -a` does)
    dry = snakemake(*tiny_args(moved), "-n")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout + dry.stderr
    # the report and the catalog made again in the new place read the new place's files
    shutil.rmtree(moved / "tiny" / "report")
    (moved / "tiny" / "prism.duckdb").unlink()
    run = snakemake(*tiny_args(moved))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "rule report:" in out and "rule catalog:" in out and "rule capture:" not in out, out
    page = (moved / "tiny" / "report" / "report.html").read_text()
    assert str(moved / "tiny") in page and str(tiny_reference) not in page
    con = duckdb.connect(str(moved / "tiny" / "prism.duckdb"), read_only=True)
    try:  # the catalog names its files relative to the job folder: resolved in the copy, not the original
        con.execute("SET file_search_path = $dir", {"dir": str(moved / "tiny")})
        assert con.execute("SELECT count(*) FROM calibrated.iterations").fetchone()[0] > 0
        assert con.execute("SELECT count(*) FROM baseline.ranks").fetchone()[0] == 2
    finally:
        con.close()


def test_the_default_job_is_the_same_in_config_and_the_package():
    import yaml

    from tests.conftest import REPO

    assert (yaml.safe_load((REPO / "config" / "config.yaml").read_text())
            == yaml.safe_load((REPO / "prism" / "configs" / "default.yaml").read_text()))
    assert data_path("tiny.yaml").is_file()
