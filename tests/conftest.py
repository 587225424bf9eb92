"""Shared test helpers: where fixtures live, how to run prism and torchrun as a user would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
PROGRAMS = REPO / "tests" / "programs"
T = TypeVar("T")


def data_path(name: str) -> Path:
    """A fixture file under tests/data/."""
    return DATA / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("PRISM_MODE", None)
    env.pop("PRISM_OUT", None)
    env.update(extra)
    return env


def run_prism(args: list[str], timeout: float = 180, cwd: Path | None = None, **env) -> subprocess.CompletedProcess:
    """`prism ARGS` as a subprocess (the console script's module), capturing its output."""
    return subprocess.run([sys.executable, "-m", "prism.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=make_env(**env))


_TORCHRUN: dict[tuple, subprocess.CompletedProcess] = {}


def run_in_session(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `cmd` from the repository in its own session; on timeout kill the whole session (torchrun's
    workers too) and raise TimeoutExpired carrying what it printed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=make_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def capture_graph_emulate(job: Path, nproc: int, prog: list[str], sandbox: str, timeout: float = 300):
    """`prism launch --mode capture --devices 2` of `prog` at `nproc` ranks into JOB/capture (asserted to pass),
    its graph into JOB/graph (asserted), and the emulation of `sandbox` from that capture into JOB/emu: the
    capture's and the emulation's completed processes (the emulation's exit is the caller's to check)."""
    cap = run_prism(["launch", "--nproc", str(nproc), "--mode", "capture", "--devices", "2",
                     "--out", str(job / "capture"), *prog], timeout=timeout)
    assert cap.returncode == 0, cap.stderr[-3000:]
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr[-3000:]
    emu = run_prism(["launch", "--nproc", str(nproc), "--mode", "emulate", "--capture", str(job / "capture"),
                     "--sandbox", sandbox, "--out", str(job / "emu"), *prog], timeout=timeout)
    return cap, emu


def run_torchrun(nproc: int, target: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """Plain torchrun (no prism) on gloo: the reference a prism run is compared with.

    Run once per test session for the same (nproc, target): the test programs print the same on every run
    (fixed seeds, gloo's fixed reduction order), so several test files comparing prism's runs with one
    program share its reference run. A failed run is not kept (each caller sees it fail). On timeout the
    whole process group (torchrun and its workers) is killed, then TimeoutExpired raised."""
    key = (nproc, tuple(target))
    if key in _TORCHRUN:
        return _TORCHRUN[key]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={free_port()}", *target]
    done = run_in_session(cmd, timeout)
    if done.returncode == 0:
        _TORCHRUN[key] = done
    return done


def run_together(*jobs: Callable[[], T]) -> list[T]:
    """Run independent jobs (callables that each run their own processes) at once; their results in order, the
    first exception raised once all have ended. On 2 cores one job often leaves a core idle (a capture on one
    device slot, a process importing torch), which the other fills; no test that asserts a timing uses it."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"


def close_lines(a: str, b: str, rel: float) -> bool:
    """Two printed lines are equal but for numbers within `rel` relative (prism's reduction order is not
    gloo's, so a program's printed floats may differ from plain torchrun's in the last digits)."""
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if abs(fx - fy) > rel * max(abs(fx), abs(fy), 1e-12):
            return False
    return True
