"""The launcher's progress watchdog (`prism.runtime.launch.stall`; issue 23: a slice run of a resumed pipeline
hung 6 minutes with an empty log): a run whose processes all stop moving outside communication (here every rank
sleeps before its first process group, which the hang watchdog never sees) is named with what each process
waits in, its Python stacks included, then stopped with exit 86; no process and no output is left."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from tests.conftest import PROGRAMS, run_prism

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stall")
    prog = folder / f"stall_probe_{os.getpid()}.py"
    shutil.copy(PROGRAMS / "stall_before_init.py", prog)
    cap = folder / "cap"
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "1", "--out", str(cap), str(prog),
                      "--stall-in", "none"], timeout=120, PRISM_STALL_TIMEOUT="2")
    assert proc.returncode == 0, proc.stderr
    assert "no progress" not in proc.stderr, "a run that moves is no stall"
    return prog, cap


@pytest.mark.parametrize("mode,args", [("capture", ["--devices", "1"]), ("slice", ["--slice-ranks", "0,1"]),
                                       ("emulate", ["--sandbox", "1"])])
def test_a_stalled_run_is_named_then_stopped(program, tmp_path, mode, args):
    prog, cap = program
    extra = [] if mode == "capture" else ["--capture", str(cap)]
    began = time.monotonic()
    proc = run_prism(["launch", "--nproc", "4", "--mode", mode, *extra, *args, "--out", str(tmp_path / "run"),
                      str(prog), "--stall-in", mode], timeout=120, PRISM_STALL_TIMEOUT="2")
    assert proc.returncode == 86, proc.stderr[-3000:]
    err = proc.stderr
    assert "[prism] no progress for 2 s: no process of the run used CPU or wrote a note" in err, err[-3000:]
    assert "rank 1 (pid " in err and "hrtimer_nanosleep" in err, err[-3000:]  # what it waits in (kernel)
    assert f'File "{prog}", line 16 in <module>' in err, err[-3000:]  # and where (its Python stack)
    assert re.search(r"\[prism\] run stopped: no progress for \d+ s", err), err[-3000:]
    assert time.monotonic() - began < 60
    assert not (tmp_path / "run").exists()
    assert not subprocess.run(["pgrep", "-f", prog.name], capture_output=True, text=True).stdout.split()
