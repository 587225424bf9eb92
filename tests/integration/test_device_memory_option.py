"""`prism launch --device-memory-gb`: bad input is refused before any rank starts, with the cause named."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from tests.conftest import run_prism

pytestmark = pytest.mark.slow


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.parametrize("extra, env, says", [
    (["--mode", "real"], {"PRISM_DEVICE": "cuda"}, "--mode real gives every rank its own device"),
    (["--mode", "capture"], {"PRISM_DEVICE": "cpu"}, "set PRISM_DEVICE=cuda"),
    (["--mode", "capture", "--device-memory-gb", "-1"], {"PRISM_DEVICE": "cuda"}, "give a positive size"),
])
def test_bad_device_memory_options(extra, env, says, tmp_path: Path) -> None:
    args = ["launch", "--nproc", "2", *extra]
    if "--device-memory-gb" not in extra:
        args += ["--device-memory-gb", "1"]
    proc = run_prism(args + ["-m", "prism.workloads.moe_gpt"], timeout=60, **env)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(_has_driver(), reason="this host has a CUDA driver")
def test_no_driver_is_named(tmp_path: Path) -> None:
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--device-memory-gb", "1",
                      "-m", "prism.workloads.moe_gpt"], timeout=60, PRISM_DEVICE="cuda")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot swap device state on this host" in proc.stderr and "libcuda.so.1" in proc.stderr
