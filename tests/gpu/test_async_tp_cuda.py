"""Async TP on CUDA (issue 21; `tests/programs/async_tp.py --device cuda`): W=2 and W=4 ranks on GPU 0 through
capture, graph, slice plan, every slice and emulate, the program asking for "nccl" as torchtitan does. On CUDA the
fused ops have torch's own kernels (symmetric memory: one GPU per rank); in prism's computing modes the process's
CUDA kernel is torch's fallback through prism's collectives (prism/runtime/symmetric_memory.py). Checked: the fused
program's capture prints what the unfused one's (the collectives apart from the matmuls) prints under capture, the
losses bitwise and the trained weights' checksums within 1e-6 (the fallback's matmul is a batched one, the unfused
program's a 2-D one: cuBLAS sums them in another order; on the H200, 2026-12-04, 3e-9 apart); every slice prints the capture's results of its ranks and the sandbox those of its ranks, bitwise; the
graph records the fused ops as their collectives. One GPU cannot run real async TP (its symmetric memory needs a
GPU a rank): not run here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import PROGRAMS, REPO, close_lines, make_env
from tests.gpu.gpu_env import NCCL_ENV, requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

BOUND_S = 240


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=BOUND_S, env=make_env(PRISM_HANG_TIMEOUT="20", PRISM_DEVICE="cuda",
                                                        CUDA_VISIBLE_DEVICES="0", **NCCL_ENV))
    assert proc.returncode == 0, f"{module} {args[:4]} exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    return sorted(line for line in lines if ranks is None or int(line.split()[2]) in ranks)


@pytest.mark.parametrize("nproc, options, sandbox", [(2, ["--compile"], "0,1"), (4, [], "1,2")],
                         ids=["w2-compiled", "w4-eager"])
def test_async_tp_on_one_gpu_through_capture_slices_and_emulate(tmp_path: Path, nproc, options, sandbox) -> None:
    prog = [str(PROGRAMS / "async_tp.py"), "--device", "cuda", *options]
    job = tmp_path / "job"
    cap = _run("prism.cli", "launch", "--nproc", str(nproc), "--mode", "capture", "--devices", "2",
               "--out", str(job / "capture"), *prog, "--ops", "fused")
    unfused = _run("prism.cli", "launch", "--nproc", str(nproc), "--mode", "capture", "--devices", "2",
                   "--out", str(tmp_path / "unfused"), *prog, "--ops", "unfused")
    mine, ref = _results(cap.stdout), _results(unfused.stdout)
    assert len([line for line in mine if line.startswith("result loss")]) == 3 * nproc and len(ref) == len(mine)
    assert [x for x in mine if "loss" in x] == [x for x in ref if "loss" in x]
    assert all(close_lines(a, b, 1e-6) for a, b in zip(mine, ref)), (mine, ref)
    _run("prism.cli", "graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph"))
    ops = pq.read_table(job / "graph" / "events.parquet", columns=["kind", "op"]).to_pylist()
    seen = {r["op"] for r in ops if r["kind"] == "collective"}
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= seen, seen
    _run("prism.slices.plan", "--job", str(job), "--devices", "2")
    sliced = []
    for k in sorted(set(pq.read_table(job / "slices" / "plan.parquet")["slice"].to_pylist())):
        sliced += _results(_run("prism.slices.run", "--job", str(job), "--slice", str(k)).stdout)
    assert sorted(sliced) == mine
    emu = _run("prism.cli", "launch", "--nproc", str(nproc), "--mode", "emulate", "--capture", str(job / "capture"),
               "--sandbox", sandbox, "--out", str(job / "emu"), *prog, "--ops", "fused")
    members = {int(r) for r in sandbox.split(",")}
    assert _results(emu.stdout) == _results(cap.stdout, members) and _results(emu.stdout)
