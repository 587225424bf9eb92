"""Real mode names a hang within seconds (the watchdog) instead of waiting out gloo's 30-minute timeout,
stops every rank and exits with the documented code; a rank that merely computes long is no hang."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time

import pytest

from prism.runtime.watchdog import HANG_EXIT_CODE
from tests.conftest import PROGRAMS, run_prism

pytestmark = pytest.mark.slow

HANGS = {
    "hang_skipped_collective": (3, [
        "no op completed on any rank for 2 s",
        "collective mismatch at all_reduce #1 on default_pg[0,1,2] (ops differ: a rank skipped or reordered a "
        "collective on this group): ranks 0-1 wait with all_reduce float32[1024]; rank 2 waits with broadcast "
        "float32[16]"]),
    "hang_send_deadlock": (2, [
        "no op completed on any rank for 2 s",
        "rank 0 waits in send to rank 1 (tag 7) on default_pg[0,1] (float32[8]); rank 1 waits in send to rank 0 "
        "(tag 7) on default_pg[0,1] (float32[8])"]),
}


def _left(name: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", name], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("name", list(HANGS))
def test_real_mode_names_the_hang_and_stops(tmp_path, name):
    nproc, words = HANGS[name]
    prog = tmp_path / f"{name}_watchdog_{os.getpid()}.py"  # a name no other process has: orphans are findable
    shutil.copy(PROGRAMS / f"{name}.py", prog)
    start = time.monotonic()
    proc = run_prism(["launch", "--nproc", str(nproc), "--mode", "real", "--hang-timeout", "2", "--out",
                      str(tmp_path / "job"), str(prog)], timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)
    assert "Traceback" not in proc.stderr and "finished" not in proc.stdout
    # start-up of 2-3 ranks (seconds; more on a loaded box) + 2 s + one poll: far from gloo's 30 minutes
    assert elapsed < 60, elapsed
    assert not (tmp_path / "job" / "raw").exists() and not list((tmp_path / "job").glob(".raw.tmp*"))
    assert not _left(prog.name)


def test_a_long_compute_on_one_rank_is_no_hang(tmp_path):
    prog = tmp_path / f"slow_rank_watchdog_{os.getpid()}.py"
    prog.write_text(textwrap.dedent("""
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        got = torch.empty(4)
        if rank == 0:
            pending = dist.irecv(got, 1)  # in flight while rank 0 computes; rank 1 sends only after ...
            end = time.thread_time() + 4.0
            while time.thread_time() < end:  # 4 s of CPU: rank 1 waits more than twice its timeout
                torch.ones(64, 64) @ torch.ones(64, 64)
            dist.send(torch.ones(4), 1)  # ... it received this
            pending.wait()
        else:
            dist.recv(got, 0)
            dist.send(got * 2, 0)
        print("finished", rank, got.tolist(), flush=True)
    """))
    proc = run_prism(["launch", "--nproc", "2", "--hang-timeout", "1.5", str(prog)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["finished 0 [2.0, 2.0, 2.0, 2.0]", "finished 1 [1.0, 1.0, 1.0, 1.0]"]


def test_bad_hang_timeout_is_refused():
    proc = run_prism(["launch", "--nproc", "2", "--hang-timeout", "-3", str(PROGRAMS / "ddp.py")])
    assert proc.returncode == 2 and "--hang-timeout -3: give seconds >= 0" in proc.stderr
    proc = run_prism(["launch", "--nproc", "2", str(PROGRAMS / "ddp.py")], PRISM_HANG_TIMEOUT="soon")
    assert proc.returncode == 2 and "PRISM_HANG_TIMEOUT='soon' is not a number" in proc.stderr
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--hang-timeout", "5", str(PROGRAMS / "ddp.py")])
    assert proc.returncode == 2 and "--hang-timeout belongs to --mode real, slice and emulate" in proc.stderr


@pytest.fixture(scope="module")
def hang_job(tmp_path_factory):
    """hang_in_slice.py (copied under a name no other process has: orphans are findable) captured at W=4 on one
    slot, its graph and calibration: (the program, the job). A capture runs through whatever --sleep-in says
    (it sleeps only under that mode), so the slice run and the emulations below share it; none writes into JOB
    but `prism emulate`, whose emulation/ is checked absent."""
    root = tmp_path_factory.mktemp("hang")
    prog = root / f"hang_in_slice_{os.getpid()}.py"
    shutil.copy(PROGRAMS / "hang_in_slice.py", prog)
    job = root / "job"
    for args in (["launch", "--nproc", "4", "--mode", "capture", "--devices", "1", "--out", str(job), str(prog),
                  "--sleep-in", "emulate"], ["graph", "--job", str(job)], ["calibrate", "--job", str(job)]):
        proc = run_prism(args, timeout=120)
        assert proc.returncode == 0, proc.stderr
    return prog, job


def test_slice_mode_names_the_hang_of_its_ranks(hang_job, tmp_path):
    """The real-mode watchdog in a slice run: the slice's ranks watch each other (the replay server answers for
    the others), exit 86 naming what each waits on, every process stopped."""
    prog, cap = hang_job
    start = time.monotonic()
    proc = run_prism(["launch", "--nproc", "4", "--mode", "slice", "--capture", str(cap),
                      "--slice-ranks", "0,1", "--hang-timeout", "2", "--out", str(tmp_path / "slice"), str(prog),
                      "--sleep-in", "slice"], timeout=120)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    assert "while every rank waited" in proc.stderr and "rank 0 waits with float32[1024]" in proc.stderr, proc.stderr
    assert "rank 1 is idle (no op and no compute" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "slice" / "raw").exists() and not _left(prog.name)


def test_emulate_names_a_sleeping_sandbox_rank(hang_job, tmp_path):
    """The real-mode rule in emulate (issue 23: a sandbox rank that slept was never diagnosed): the replay
    worker takes part in the watchdog, so one sandbox rank sleeping while the virtual ranks wait on it ends
    in exit 86 naming it and what the worker waits in; every process stopped, nothing published. Then the
    `prism emulate` stage over the same job: exit 86, no emulation/ and no staging left."""
    prog, job = hang_job
    start = time.monotonic()
    proc = run_prism(["launch", "--nproc", "4", "--mode", "emulate", "--capture", str(job), "--sandbox", "1",
                      "--hang-timeout", "2", "--out", str(tmp_path / "emu"), str(prog), "--sleep-in", "emulate"],
                     timeout=120)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    assert "the replay worker (the virtual ranks) waits in all_reduce #1 on group" in proc.stderr, proc.stderr
    assert "for sandbox rank 1: rank 1 is idle (no op and no compute" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "emu").exists() and not _left(prog.name)

    proc = run_prism(["emulate", "--job", str(job), "--sandbox", "1", "--hang-timeout", "2"], timeout=120)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr  # the stage forwards the launcher's output on its stdout
    assert "rank 1 is idle" in said and "prism launch exit code 86" in proc.stderr, said[-3000:]
    assert not (job / "emulation").exists() and not list(job.glob(".emulation.*")) and not _left(prog.name)
