"""Reproducibility of the pipeline: a re-run of the same inputs gives the same artifacts (measured values aside:
tests/workflow/runs.py MEASURED_*, listed in the README), and a run interrupted mid-stage leaves no half-written
artifact nor a live process, and resumes to the same artifacts as a clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO
from tests.workflow.runs import (SNAKEMAKE, differences, half_written, processes_mentioning, snakemake,
                                 snakemake_env, tiny_args)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1500)
def test_a_rerun_gives_the_same_artifacts_except_measured_values(tiny_reference, tmp_path):
    proc = snakemake(*tiny_args(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert differences(tiny_reference, tmp_path / "tiny") == []
    assert half_written(tmp_path / "tiny") == []


def _wait_for(predicate, proc, what: str, log, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"snakemake ended before {what}: {log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


@pytest.mark.timeout(1500)
def test_ctrl_c_during_capture_leaves_nothing_half_written_and_resumes(tiny_reference, tmp_path):
    """Ctrl-C: SIGINT to Snakemake's whole process group (Snakemake, the capture's launcher and its ranks)."""
    args = tiny_args(tmp_path, "profiles/local", "baseline={run: never}")
    job = tmp_path / "tiny"
    log = job / "logs" / "capture.log"
    out_log = tmp_path / "snakemake.log"
    log_file = open(out_log, "w")
    proc = subprocess.Popen([*SNAKEMAKE, *args], cwd=REPO, env=snakemake_env(), stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # the capture's ranks are past their first training step: mid-stage
        _wait_for(lambda: log.is_file() and "step=1" in log.read_text(), proc, "capture step", out_log)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log_file.close()
    out = out_log.read_text()
    assert proc.returncode != 0, out
    assert "launcher got signal" in log.read_text(), "the capture was not interrupted mid-stage"
    assert not (job / "capture" / "raw").exists(), "an interrupted capture published its raw trace"
    assert half_written(job) == []
    time.sleep(1)  # ranks exit within a second of their launcher's signal
    assert processes_mentioning(str(tmp_path)) == []

    resumed = snakemake(*args)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert differences(tiny_reference, job, under=("capture", "graph", "slices", "calibrated")) == []
    assert (job / "summary.txt").is_file()
