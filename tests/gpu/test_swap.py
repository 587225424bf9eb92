"""Device-state swapping in capture on one GPU (prism/runtime/capture/device_state.py, cuda_checkpoint.py): with
`--device-memory-gb` low enough that only one rank's state fits, blocked ranks' device state goes to host
memory through the CUDA checkpoint API and comes back before they run; the capture gives the real GPU
run's losses (gloo with CUDA tensors) within 1e-5, with a non-zero swap count. The swap numbers go to
$PRISM_GPU_TABLES/swap.json (default: the test's temporary folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO, make_env
from tests.gpu.gpu_env import NCCL_ENV, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--device", "cuda", "--backend", "gloo", "--steps", "2",
            "--dp", "4", "--ep", "2", "--microbatches", "1"]


def launch(mode: str, out: Path, extra: list[str] = ()) -> tuple[list[float], str]:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", "4", "--mode", mode, "--out", str(out), *extra]
    proc = subprocess.run(cmd + WORKLOAD, capture_output=True, text=True, timeout=400, cwd=REPO,
                          env=make_env(PRISM_DEVICE="cuda", CUDA_VISIBLE_DEVICES="0", **NCCL_ENV))
    assert proc.returncode == 0, f"{mode} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return [float(w[5:]) for w in proc.stdout.split() if w.startswith("loss=")], proc.stderr


def peak_reserved(job: Path) -> int:
    most = 0
    for d in (job / "raw").glob("rank=*"):
        with pa.ipc.open_stream(str(d / "events.arrow")) as r:
            most = max(most, max(r.read_all().column("mem_reserved_bytes").to_pylist()))
    return most


def test_capture_with_swapping_equals_real_run(tmp_path: Path) -> None:
    real, _ = launch("real", tmp_path / "real")
    footprint = peak_reserved(tmp_path / "real")
    capacity_gb = 1.5 * footprint / 2**30  # one rank's state fits, not two: every switch to another rank swaps
    plain, _ = launch("capture", tmp_path / "plain", ["--devices", "1"])
    swapped, _ = launch("capture", tmp_path / "swap", ["--devices", "1", "--device-memory-gb", repr(capacity_gb)])
    assert real and len(swapped) == len(real) == len(plain)
    for a, b, c in zip(real, plain, swapped):
        assert abs(a - c) <= 1e-5 * abs(a) and b == c, f"real {real} capture {plain} swapped capture {swapped}"
    meta = json.loads((tmp_path / "swap" / "raw" / "meta.json").read_text())
    cap = meta["capture"]
    assert cap["swaps_out"] > 0 and cap["swaps_in"] > 0 and cap["swap_out_bytes"] > 0, cap
    plain_meta = json.loads((tmp_path / "plain" / "raw" / "meta.json").read_text())
    out = Path(os.environ.get("PRISM_GPU_TABLES") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "swap.json").write_text(json.dumps({
        "workload": WORKLOAD, "capacity_gb": capacity_gb, "rank_peak_reserved": footprint, "iterations": 2,
        "losses": {"real": real, "capture": plain, "capture_swapped": swapped},
        "swapped": {k: cap[k] for k in cap if k.startswith("swap") or k == "context_switches"},
        "wall_s": {"capture": plain_meta["wall_s"], "capture_swapped": meta["wall_s"]}}, indent=2) + "\n")
