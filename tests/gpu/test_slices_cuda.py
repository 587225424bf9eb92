"""Slice runs and calibration with CUDA (issue 9 item 4): capture on the GPU -> graph -> slices plan -> slice
runs on the GPU -> durations from the slices -> calibrate.

The slice's ranks run the workload with CUDA tensors on GPU 0 (two ranks per slice share it, each its own
process and stream, as capture's slots do); the replay server answers for the other ranks from the host
(CPU tensors; gloo copies the slice ranks' CUDA tensors across). Checked, as the CPU slice tests check
(tests/integration/test_slice_mode.py): every slice rank prints exactly the capture's losses and gradient
norms (the same printed values: slice mode replays the capture's recorded results of order-dependent
reductions into the ranks' CUDA tensors), its events repeat the capture graph's. Then the clocks: every
compute event carries its GPU time from CUDA events (`device_ns` >= 0, some > 0, none negative) on another
clock than the host's CPU time, the durations calibration uses are those GPU times for compute (and the
host CPU time for waits, `prism.calibrate.durations.own_ns`), and the calibrated iteration time is
positive. Numbers go to $PRISM_GPU_TABLES/slices_cuda-<layout>.json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, make_env
from tests.gpu.gpu_env import NCCL_ENV, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

W = 4
WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--device", "cuda", "--backend", "gloo", "--steps", "2"]
LAYOUTS = {
    # groups of two: the slices {0,1}, {2,3} (TP pairs), each with one rank printing the loss
    "tp2-dp2-ep2": ["--tp", "2", "--dp", "2", "--ep", "2"],
    # a DP group of four: its gradient all-reduces take the capture's recorded results (copied into CUDA
    # tensors); every rank prints the loss
    "dp4-ep2": ["--dp", "4", "--ep", "2", "--microbatches", "1"],
}
STEP = re.compile(r"step=\d+ (?:loss|grad_norm)=\S+")


def run(device: str, *args: str, module: str = "prism.cli", timeout: float = 240) -> subprocess.CompletedProcess:
    env = make_env(PRISM_DEVICE=device, CUDA_VISIBLE_DEVICES="0", **NCCL_ENV)
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env)
    assert proc.returncode == 0, f"{module} {args[:4]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert "re-initialize CUDA" not in proc.stderr
    return proc


def pipeline(job: Path, flags: list[str], device: str = "cuda") -> dict:
    """Capture, graph, plan (slices of two ranks), every slice, durations, calibration; what they printed."""
    cap = run(device, "launch", "--nproc", str(W), "--mode", "capture", "--devices", "2", "--out",
              str(job / "capture"), *WORKLOAD[:3], device, *WORKLOAD[4:], *flags)
    run(device, "graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph"))
    run(device, "--job", str(job), "--devices", "2", module="prism.slices.plan")
    slices = sorted(set(pq.read_table(job / "slices" / "plan.parquet")["slice"].to_pylist()))
    runs = {k: run(device, "--job", str(job), "--slice", str(k), module="prism.slices.run") for k in slices}
    run(device, "--job", str(job), module="prism.calibrate.from_slices")
    calib = run(device, "--job", str(job), "--durations", str(job / "slices" / "durations.parquet"), "--transfers",
                str(job / "slices" / "transfers.parquet"), "--out", str(job / "calibrated"), module="prism.calibrate")
    return {"capture": cap, "slices": runs, "calibrate": calib}


def check(job: Path, got: dict, device: str = "cuda") -> dict:
    """The assertions of the module docstring; returns the figures."""
    cap, runs = got["capture"], got["slices"]
    assert len(runs) == 2
    want = sorted(STEP.findall(cap.stdout + cap.stderr))
    assert len(want) >= 8, want  # 2 steps x (a loss and a grad norm) x at least two printing ranks
    assert sorted(line for p in runs.values() for line in STEP.findall(p.stdout + p.stderr)) == want
    for k, proc in runs.items():
        assert f"device {device}" in proc.stdout, proc.stdout

    graph = {(e["rank"], e["seq"]): e for e in pq.read_table(job / "graph" / "events.parquet").to_pylist()}
    durations = dict(zip(*(pq.read_table(job / "slices" / "durations.parquet")[c].to_pylist()
                           for c in ("event_id", "duration_ns"))))
    figures: dict = {"ranks": {}}
    for k in runs:
        rows = pq.read_table(job / "slices" / f"slice={k}" / "events.parquet").to_pylist()
        for rank in sorted({r["rank"] for r in rows}):
            mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["seq"])
            assert [(r["kind"], r["op"], r["bytes"], r["event_id"]) for r in mine] == [
                (g["kind"], g["op"], g["bytes"], g["event_id"]) for g in
                (graph[rank, r["seq"]] for r in mine)], f"rank {rank}: slice events differ from the capture graph"
            assert all(r["t_end_ns"] >= r["t_start_ns"] and r["cpu_ns"] >= -1 and r["device_ns"] >= -1 for r in mine)
            compute = [r for r in mine if r["kind"] == "compute"]
            dev = [r["device_ns"] for r in compute]
            assert compute and min(dev) >= 0 and max(dev) > 0, f"rank {rank}: device_ns of compute {dev[:8]}"
            # calibration's durations: compute its GPU time, waits the host's CPU time
            assert all(durations[r["event_id"]] == r["device_ns"] for r in compute)
            waits = [r for r in mine if r["kind"] == "wait" and r["cpu_ns"] >= 0]
            assert all(durations[r["event_id"]] == r["cpu_ns"] for r in waits)
            if device == "cuda":  # two clocks: the GPU's and the host thread's (which only launched kernels)
                assert sum(r["device_ns"] != r["cpu_ns"] for r in compute) > len(compute) // 2
                marks = [r for r in mine if r["kind"] == "marker"]
                assert marks and all(r["mem_bytes"] > 0 for r in marks), f"rank {rank}: no allocator memory"
            figures["ranks"][rank] = {
                "slice": k, "compute_events": len(compute), "compute_gpu_ms": sum(dev) / 1e6,
                "compute_cpu_ms": sum(max(r["cpu_ns"], 0) for r in compute) / 1e6,
                "wait_cpu_ms": sum(r["cpu_ns"] for r in waits) / 1e6,
                "wait_device_ms": sum(r["device_ns"] for r in waits) / 1e6}
    iters = pq.read_table(job / "calibrated" / "iterations.parquet").to_pylist()
    assert iters and all(it["duration_ns"] > 0 for it in iters), iters
    assert "iteration time" in got["calibrate"].stdout
    figures["calibrated_iteration_ms"] = sorted({round(it["duration_ns"] / 1e6, 3) for it in iters})
    figures["calibrate_says"] = [line for line in got["calibrate"].stdout.splitlines() if "iteration" in line]
    figures["losses"] = want
    return figures


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_slices_and_calibration_on_cuda(layout: str, tmp_path: Path) -> None:
    job = tmp_path / "job"
    figures = check(job, pipeline(job, LAYOUTS[layout]))
    out = Path(os.environ.get("PRISM_GPU_TABLES") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"slices_cuda-{layout}.json").write_text(json.dumps({"layout": layout, **figures}, indent=2) + "\n")
    print(json.dumps({"layout": layout, **figures}, indent=1))
