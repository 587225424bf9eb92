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
