"""Emulation with a sandbox rank on the GPU (issue 9 item 4): the sandbox rank runs the workload with CUDA
tensors on GPU 0 while the replay worker hosts the virtual ranks on the host; data crosses at the boundary
through prism's transport (copies to and from host memory), and the pruned protocol's reductions of CUDA
tensors fold with the `cuda/` kernel. The sandbox prints the capture's losses and gradient norms (a
capture of the same job with CUDA ranks) within 1e-5 relative, its trace carries CUDA device time, and its
peak allocated device memory is the capture's for that rank within 0.01 % (prism keeps its own tensors off
the sandbox's device). Numbers go to $PRISM_GPU_TABLES/emulate_memory-<layout>.json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO, make_env
from tests.gpu.gpu_env import NCCL_ENV, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

RTOL = 1e-5
STEP = re.compile(r"step=(\d+) (loss|grad_norm)=(\S+)")
LAYOUTS = {  # workload flags, the sandbox (a rank that prints the loss: tp 0 of the last stage), whether the
    # sandbox continues a fold chain from a received accumulator (it is not first in its groups), so that its
    # live CUDA contribution is folded in the cuda/ kernel; a sandbox first in every group folds the parts it
    # receives onto a host copy of its own contribution, on the CPU path (bitwise the same)
    "tp2-dp2-ep2": (["--tp", "2", "--dp", "2", "--ep", "2"], "0", False),
    "pp2-dp2": (["--pp", "2", "--dp", "2", "--microbatches", "2"], "2", True),
}


def prism(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "prism.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=make_env(PRISM_DEVICE="cuda", CUDA_VISIBLE_DEVICES="0",
                                                                  **NCCL_ENV))
    assert proc.returncode == 0, f"{args[:4]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert "re-initialize CUDA" not in proc.stderr
    return proc


def peak_allocated(events: Path) -> int:
    with pa.ipc.open_stream(str(events)) as r:
        ev = r.read_all().to_pydict()
    return max(p for k, p in zip(ev["kind"], ev["mem_peak_bytes"]) if k == "marker")


def steps(text: str) -> list[tuple[int, str, float]]:
    return sorted(set((int(m[1]), m[2], float(m[3])) for m in STEP.finditer(text)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cuda_sandbox_repeats_the_capture(layout: str, tmp_path: Path) -> None:
    flags, sandbox, kernel = LAYOUTS[layout]
    prog = ["-m", "prism.workloads.moe_gpt", "--device", "cuda", "--backend", "gloo", "--steps", "2", *flags]
    cap = prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out", str(tmp_path / "cap"),
                 *prog])
    emu = prism(["launch", "--nproc", "4", "--mode", "emulate", "--capture", str(tmp_path / "cap"), "--sandbox",
                 sandbox, "--out", str(tmp_path / "emu"), *prog])
    want, got = steps(cap.stdout + cap.stderr), steps(emu.stdout + emu.stderr)
    assert len(got) == 4 and [g[:2] for g in got] == [w[:2] for w in want], (got, want)
    for (s, what, x), (_, _, y) in zip(got, want):
        assert abs(x - y) <= RTOL * max(abs(x), abs(y)), f"step {s} {what}: emulated {x} capture {y}"
    with pa.ipc.open_stream(str(tmp_path / "emu" / "raw" / f"rank={sandbox}" / "events.arrow")) as r:
        ev = r.read_all().to_pydict()
    compute = [d for k, d in zip(ev["kind"], ev["device_ns"]) if k == "compute"]
    assert compute and min(compute) >= 0 and max(compute) > 0, f"device_ns of compute {compute[:8]}"
    marks = [i for i, k in enumerate(ev["kind"]) if k == "marker"]
    assert marks and all(ev["mem_bytes"][i] > 0 for i in marks), "the sandbox's allocator memory at markers"
    # where the sandbox continues a chain from a received accumulator, its reductions ran in the cuda/ kernel
    emulation = json.loads((tmp_path / "emu" / "raw" / "meta.json").read_text())["emulation"]
    # memory fidelity of the sandbox: its peak allocated equals the capture's for the same rank within
    # 0.01 % (the pruned protocol keeps its accumulator, received parts and results in host memory)
    cap_peak = peak_allocated(tmp_path / "cap" / "raw" / f"rank={sandbox}" / "events.arrow")
    emu_peak = peak_allocated(tmp_path / "emu" / "raw" / f"rank={sandbox}" / "events.arrow")
    out = Path(os.environ.get("PRISM_GPU_TABLES") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"emulate_memory-{layout}.json").write_text(json.dumps({
        "layout": layout, "sandbox": int(sandbox), "capture_peak_allocated": cap_peak,
        "emulate_peak_allocated": emu_peak, "difference_bytes": emu_peak - cap_peak,
        "cuda_folds": emulation["cuda_folds"], "losses": {"capture": want, "emulate": got}}, indent=2) + "\n")
    assert abs(emu_peak - cap_peak) <= 1e-4 * cap_peak, f"sandbox peak allocated {emu_peak:,} vs capture {cap_peak:,}"
    assert (emulation["cuda_folds"] > 0) == kernel, emulation
