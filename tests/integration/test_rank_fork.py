"""Ranks forked from helper processes in parallel (`prism.runtime.launch.rank_fork`, forced at small W with
PRISM_FORK_BATCH): every rank ends up the zygote's child, dies with it (PDEATHSIG), and a capture killed while
it runs or while it forks leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from prism.bench.sampled_run import descendants as _descendants
from tests.conftest import PROGRAMS, REPO, make_env, run_prism

pytestmark = pytest.mark.slow

PARENTS = """
    import ctypes, os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    sig = ctypes.c_int(0)
    ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} parent {os.getppid()} pdeathsig {sig.value} sum {t.item():.0f}", flush=True)
"""


def test_helpers_fork_ranks_that_are_the_zygotes_children(tmp_path):
    prog = tmp_path / "parents.py"
    prog.write_text(textwrap.dedent(PARENTS))
    job = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "16", "--mode", "capture", "--devices", "2", "--out", str(job), str(prog)],
                     timeout=240, PRISM_FORK_BATCH="4")
    assert proc.returncode == 0, proc.stderr
    lines = sorted(proc.stdout.split("\n")[:-1], key=lambda line: int(line.split()[1]))
    assert [int(line.split()[1]) for line in lines] == list(range(16)), proc.stdout
    assert {line.split(" parent ")[1] for line in lines} == {f"{lines[0].split()[3]} pdeathsig 9 sum 16"}
    meta = json.loads((job / "raw" / "meta.json").read_text())
    assert meta["capture"]["fork_helpers"] == 4  # 16 ranks, 4 a helper
    # the one parent is the zygote (the launcher's child), not one of the helpers (which have exited)
    assert lines[0].split()[3] != str(os.getpid())


def _alive(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a zombie's is empty)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = open(f"/proc/{entry.name}/cmdline", "rb").read()
            except OSError:
                continue
            if marker.encode() in cmd:
                out.append(int(entry.name))
    return out


def _zygote(launcher: int, timeout: float) -> tuple[int, str]:
    """The launcher's zygote and its spec file (in the command line every rank inherits)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for pid in _descendants(launcher):
            try:
                args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"prism.runtime.launch.zygote" in args:
                return pid, args[args.index(b"prism.runtime.launch.zygote") + 1].decode()
        time.sleep(0.05)
    raise AssertionError("no zygote started")


@pytest.mark.parametrize("when", ["running", "forking"])
def test_a_killed_capture_leaves_no_rank(tmp_path, when):
    prog = tmp_path / "forever.py"
    prog.write_text("import time, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                    "print('in', flush=True)\nwhile True:\n    dist.all_reduce(torch.ones(2)); time.sleep(0.01)\n")
    nproc = 64 if when == "forking" else 8
    launcher = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", str(nproc), "--mode",
                                 "capture", "--devices", "1", "--out", str(tmp_path / "job"), str(prog)], cwd=REPO,
                                env=make_env(PRISM_FORK_BATCH="2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        zygote, spec = _zygote(launcher.pid, 120)
        if when == "running":
            assert launcher.stdout.readline().strip() == "in"
        else:  # once the first ranks exist and before the 32 helpers are done
            end = time.monotonic() + 120
            while len(_alive(spec)) < 6 and time.monotonic() < end:
                time.sleep(0.01)
            assert len(_alive(spec)) < nproc, "every rank was forked before the kill: no kill while forking"
        os.kill(zygote, signal.SIGKILL)
        end = time.monotonic() + 20
        while _alive(spec) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _alive(spec), f"ranks or helpers outlived the killed zygote: {_alive(spec)}"
        launcher.wait(timeout=30)
        assert launcher.returncode != 0
    finally:
        launcher.kill()
        launcher.communicate()


def test_layout_groups_program_in_capture(tmp_path):
    """The group-creation program of the A/B in docs/benchmarks.md, checked at W=8 (tp2·pp2·dp2·ep2)."""
    proc = run_prism(["launch", "--nproc", "8", "--mode", "capture", "--devices", "2", "--out", str(tmp_path / "job"),
                      str(PROGRAMS / "layout_groups.py"), "2", "2", "2", "2"], timeout=240, PRISM_FORK_BATCH="2")
    assert proc.returncode == 0, proc.stderr
    assert "sum=8" in proc.stdout
