"""Capture on one GPU: the zygote never initialises CUDA, the ranks do after the fork, and a capture of
the reference workload with CUDA tensors gives the real GPU run's losses (gloo with CUDA tensors, W=4
ranks on GPU 0) within 1e-5 relative; its trace carries CUDA device times and allocator memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO, make_env
from tests.gpu.gpu_env import NCCL_ENV, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

TIMEOUT_S = 300
RTOL = 1e-5
WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--device", "cuda", "--backend", "gloo", "--steps", "2"]
LAYOUTS = {"dp4-ep2": ["--dp", "4", "--ep", "2", "--microbatches", "1"],
           "tp2-pp2": ["--tp", "2", "--pp", "2", "--microbatches", "2"]}


def launch(mode: str, flags: list[str], out: Path | None = None) -> list[float]:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", "4", "--mode", mode]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd + WORKLOAD + flags, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env=make_env(PRISM_DEVICE="cuda", CUDA_VISIBLE_DEVICES="0", **NCCL_ENV))
    assert proc.returncode == 0, f"{mode} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert "re-initialize CUDA" not in proc.stderr
    losses = [float(w[5:]) for w in proc.stdout.split() if w.startswith("loss=")]
    assert losses, f"{mode}: no loss printed:\n{proc.stdout[-2000:]}"
    return losses


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_capture_on_gpu_equals_real_gpu_run(layout: str, tmp_path: Path) -> None:
    real = launch("real", LAYOUTS[layout], tmp_path / "real")
    cap = launch("capture", LAYOUTS[layout], tmp_path / "cap")
    assert len(cap) == len(real)
    for a, b in zip(real, cap):
        assert abs(a - b) <= RTOL * abs(a), f"capture {cap} != real {real}"
    for job in ("real", "cap"):
        with pa.ipc.open_stream(str(tmp_path / job / "raw" / "rank=0" / "events.arrow")) as r:
            ev = r.read_all().to_pydict()
        compute = [d for k, d in zip(ev["kind"], ev["device_ns"]) if k == "compute"]
        assert compute and min(compute) >= 0 and max(compute) > 0, f"{job}: device_ns of compute {compute[:5]}"
        marks = [i for i, k in enumerate(ev["kind"]) if k == "marker"]
        assert all(ev["mem_bytes"][i] > 0 and ev["mem_reserved_bytes"][i] >= ev["mem_bytes"][i]
                   and ev["mem_peak_bytes"][i] >= ev["mem_bytes"][i] for i in marks), f"{job}: allocator memory"
