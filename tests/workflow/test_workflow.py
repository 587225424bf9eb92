"""Workflow level: the Snakefile lints clean, dry-runs, and runs the tiny job end to end (then is cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.conftest import REPO, data_path, make_env, run_prism

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile"]


def snakemake(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = make_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([*SNAKEMAKE, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env)


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_default_config_dry_run(tmp_path):
    proc = snakemake("--profile", "profiles/local", "-n", "--config", f"results={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for rule in ("capture", "graph", "summary"):
        assert f"rule {rule}:" in out or f"\n{rule} " in out, rule
    # W=16 does not fit this machine's cores: no ground-truth run is scheduled
    if len(os.sched_getaffinity(0)) < 16:
        assert "baseline_run" not in out


def test_tiny_config_dry_run_includes_the_baseline(tmp_path):
    proc = snakemake("--profile", "profiles/local", "-n", "--configfile", str(data_path("tiny.yaml")),
                     "--config", f"results={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for rule in ("baseline_run", "baseline_graph", "baseline_summary", "capture", "graph", "summary"):
        assert rule in out, rule


def test_bad_config_is_rejected_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: bad\nnproc: 2\nworkload: {module: m}\nbaseline: {run: sometimes}\n")
    proc = snakemake("--profile", "profiles/local", "-n", "--configfile", str(bad))
    assert proc.returncode != 0
    assert "sometimes" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_tiny_job_end_to_end_then_cached(tmp_path):
    args = ("--profile", "profiles/local", "--configfile", str(data_path("tiny.yaml")),
            "--config", f"results={tmp_path}")
    proc = snakemake(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    captured = (tmp_path / "tiny" / "summary.txt").read_text()
    assert "capture: 2 ranks on 2 device slots" in captured and "mode: capture" in captured
    job = tmp_path / "tiny" / "baseline"
    summary = (job / "summary.txt").read_text()
    assert "ranks: 2" in summary and "iterations: 3" in summary and "iteration time" in summary
    con = duckdb.connect(str(job / "prism.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM ranks").fetchone()[0] == 2
    n_comms = con.execute("SELECT count(*) FROM comms").fetchone()[0]
    assert n_comms > 0
    # README query: per-rank iteration time
    q = run_prism(["sql", "--job", str(job), "--csv",
                   "SELECT rank, count(*) AS n FROM events WHERE op = 'iteration_end' GROUP BY rank ORDER BY rank"])
    assert q.returncode == 0, q.stderr
    assert q.stdout.split() == ["rank,n", "0,3", "1,3"]
    # nothing changed: nothing is scheduled
    again = snakemake(*args, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    # a slice run reads the capture's payloads: one that must run again without them gets the capture re-run
    # first (were they undeclared, the slice run alone would be scheduled, and fail for want of payloads)
    shutil.rmtree(tmp_path / "tiny" / "capture" / "payloads")
    events = tmp_path / "tiny" / "slices" / "slice=0" / "events.parquet"
    events.unlink()
    lost = snakemake(*args, "-n", str(events))
    out = lost.stdout + lost.stderr
    assert lost.returncode == 0, out
    assert f"Missing output files: {tmp_path / 'tiny' / 'capture' / 'payloads'}" in out, out
    for rule in ("rule capture:", "rule graph:", "checkpoint slice_plan:", "rule slice_run:"):
        assert rule in out, (rule, out)
