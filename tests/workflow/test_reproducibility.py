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


def _zygote(sid: int) -> list[int]:
    """The zygote of session `sid`'s launcher: the process running prism.runtime.launch.zygote whose parent does
    not (its forked ranks have its command line too)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat", "rb").read()
            fields = stat[stat.rindex(b")") + 2:].split()  # state, ppid, pgrp, session, ...
            if int(fields[3]) == sid and b"prism.runtime.launch.zygote" in open(f"/proc/{entry}/cmdline",
                                                                                 "rb").read():
                found[int(entry)] = int(fields[1])
        except (OSError, ValueError):
            continue
    return [pid for pid, parent in found.items() if parent not in found]


def _stop_forked_ranks(zygote: int) -> list[int]:
    """SIGSTOP the zygote's forked ranks (its children with its command line; not a helper it runs); the ones
    stopped."""
    stopped = []
    try:
        children = [int(c) for t in os.listdir(f"/proc/{zygote}/task")
                    for c in open(f"/proc/{zygote}/task/{t}/children").read().split()]
    except OSError:
        return []
    for pid in children:
        try:
            if b"prism.runtime.launch.zygote" in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        except OSError:  # gone already
            continue
    return stopped


def _wait_for_pid(find, proc, what: str, log, timeout: float = 600, period: float = 0.05) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (found := find()):
        assert proc.poll() is None, f"snakemake ended before {what}: {log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(period)
    return found


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
        # mid-stage, deterministically: the tiny capture's ranks live ~0.2 s (its 3 steps), less than a poll of
        # the log could catch on a loaded box. So its first rank is stopped (SIGSTOP) as soon as the zygote has
        # forked it, Ctrl-C goes to the whole group, and the stopped ranks resume into it.
        zygote, = _wait_for_pid(lambda: _zygote(proc.pid), proc, "the zygote", out_log)
        ranks = _wait_for_pid(lambda: _stop_forked_ranks(zygote), proc, "a forked rank", out_log, period=0.002)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)  # the launcher and zygote take the signal while the ranks are stopped mid-capture
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # stopped for good by the zygote (SIGKILL reaches a stopped process)
                pass
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
