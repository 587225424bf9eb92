"""Reproducibility of the pipeline: a run interrupted mid-stage leaves no half-written artifact nor a live process,
and resumes to the same artifacts as a clean run of the same inputs (measured values aside: tests/workflow/runs.py
MEASURED_*, listed in the README). The resumed run is this suite's second run of the tiny job locally (a separate
clean re-run cost CI ~2 min and compared nothing more); test_slurm compares a third, baseline included."""

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
        # the capture's ranks have started (their first line): mid-stage. (Waiting for "step=1" raced with
        # the 3-step capture's end on a loaded box: its lines can reach the log together.)
        _wait_for(lambda: log.is_file() and "moe_gpt: rank" in log.read_text(), proc, "capture ranks", out_log)
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
    # the resumed job equals the reference run, measured values aside (every stage but the baseline, which this
    # run leaves out; test_slurm compares a whole second run, baseline included)
    assert differences(tiny_reference, job,
                       under=("capture", "graph", "slices", "calibrated", "emulation", "report")) == []
    assert (job / "summary.txt").is_file()
    assert half_written(job) == []
