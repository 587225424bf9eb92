"""Fixtures shared by integration test modules: captures several modules read."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, run_prism


@pytest.fixture(scope="session")
def reduction_order_capture(tmp_path_factory):
    """reduction_order.py (groups of 4: every summation order rounds differently) captured at W=4 on one device
    slot into JOB/capture: (JOB, the capture's CompletedProcess). test_emulate_mode writes its emulations beside
    it in JOB; others copy JOB/capture into a job of their own."""
    job = tmp_path_factory.mktemp("reduction_order") / "job"
    cap = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "1", "--out", str(job / "capture"),
                     str(PROGRAMS / "reduction_order.py")])
    assert cap.returncode == 0, cap.stderr[-3000:]
    return job, cap


@pytest.fixture(scope="session")
def workload_captures(tmp_path_factory):
    """`get(nproc, program, devices)`: the program captured into JOB/capture, once per session for the same
    arguments (its first caller pays for it, inside its own test, so it can run beside that test's torchrun):
    (JOB, the capture's CompletedProcess). test_emulate_mode emulates against it, test_slice_mode runs its
    slices (the same W=4 TP2 x DP2 x EP2 program); each writes its own folders beside JOB/capture."""
    done: dict[tuple, tuple] = {}

    def get(nproc: int, prog: list[str], devices: int = 2):
        key = (nproc, tuple(prog), devices)
        if key not in done:
            job = tmp_path_factory.mktemp("layout") / "job"
            cap = run_prism(["launch", "--nproc", str(nproc), "--mode", "capture", "--devices", str(devices),
                             "--out", str(job / "capture"), *prog])
            assert cap.returncode == 0, cap.stderr[-3000:]
            done[key] = job, cap
        return done[key]
    return get
