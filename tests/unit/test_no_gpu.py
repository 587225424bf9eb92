"""Bad input of the GPU path on a machine without a usable GPU (CI): `--device cuda` and PRISM_DEVICE=cuda are
one clear error, exit 2, nothing written -- not a ZeroDivisionError from the workload or a hang."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from prism.runtime.launch.launch_spec import LaunchError, cuda_missing, parse, validate
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is usable here")


def test_cuda_missing_names_the_cause():
    why = cuda_missing()
    assert why and ("built without CUDA" in why or "is_available() is False" in why)


def test_launch_with_prism_device_cuda_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PRISM_DEVICE", "cuda")
    spec = parse(["--nproc", "2", "--mode", "capture", "--out", str(tmp_path / "job"), "-m",
                  "prism.workloads.moe_gpt", "--device", "cuda"])
    with pytest.raises(LaunchError, match="PRISM_DEVICE=cuda, but .*PRISM_DEVICE=cpu"):
        validate(spec)
    assert not (tmp_path / "job").exists()


def test_workload_device_cuda_is_a_clear_error():
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="0", WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "-m", "prism.workloads.moe_gpt", "--device", "cuda", "--steps", "1"],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--device cuda, but no CUDA device is usable here" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
