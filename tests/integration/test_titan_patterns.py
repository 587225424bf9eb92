"""torchtitan 0.2.2's CUDA training step in public APIs (`tests/programs/titan_cuda_patterns.py`: an "nccl"
default group, an int64 functional all-reduce of the valid-token count, FSDP2 reshard-after-forward, functional
loss all-reduce) through capture -> graph -> slice plan -> every slice -> emulate (sandbox 1), each run bounded
and with a 20 s hang timeout (issue 21 item 3: on the H200 these slices and this emulation hung). Checked: no
run hangs (exit 0 within its bound), the slices print the capture's losses of their ranks and the sandbox the
capture's losses of rank 1, bitwise (hex). `pipeline` is shared with tests/gpu/test_titan_patterns_cuda.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import PROGRAMS, REPO, make_env

pytestmark = pytest.mark.slow

W = 4
BOUND_S = 240  # one run's wall-clock bound (a hang is stopped by the 20 s hang timeout well before)
LOSS = re.compile(r"^result loss (\d+) (\d+) (\S+)$", re.M)


def _run(device: str, module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=BOUND_S, env=make_env(PRISM_HANG_TIMEOUT="20", PRISM_DEVICE=device, **env))
    assert proc.returncode == 0, f"{module} {args[:4]} exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def losses(text: str) -> set[tuple[int, int, str]]:
    return {(int(r), int(s), x) for r, s, x in LOSS.findall(text)}


def pipeline(job: Path, device: str, program_args: list[str], **env: str) -> dict[str, set]:
    """Capture, graph, plan, every slice, emulate with sandbox 1: the losses each printed."""
    prog = [str(PROGRAMS / "titan_cuda_patterns.py"), "--device", device, "--steps", "2", *program_args]
    cap = _run(device, "prism.cli", "launch", "--nproc", str(W), "--mode", "capture", "--devices", "2", "--out",
               str(job / "capture"), *prog, **env)
    _run(device, "prism.cli", "graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out",
         str(job / "graph"), **env)
    _run(device, "prism.slices.plan", "--job", str(job), "--devices", "2", **env)
    out = {"capture": losses(cap.stdout)}
    for k in sorted(set(pq.read_table(job / "slices" / "plan.parquet")["slice"].to_pylist())):
        out[f"slice {k}"] = losses(_run(device, "prism.slices.run", "--job", str(job), "--slice", str(k), **env).stdout)
    emu = _run(device, "prism.cli", "launch", "--nproc", str(W), "--mode", "emulate", "--capture", str(job / "capture"),
               "--sandbox", "1", "--out", str(job / "emu"), *prog, **env)
    out["emulate"] = losses(emu.stdout)
    return out


def check(got: dict[str, set]) -> None:
    cap = got["capture"]
    assert {r for r, _, _ in cap} == set(range(W)) and len(cap) == 2 * W, cap
    sliced = set()
    for name, rows in got.items():
        if name.startswith("slice"):
            assert rows and rows <= cap, f"{name}: {sorted(rows)} vs capture {sorted(cap)}"
            sliced |= rows
    assert sliced == cap  # every rank ran in some slice, each printing the capture's losses
    assert got["emulate"] == {row for row in cap if row[0] == 1}, (got["emulate"], cap)


def test_titan_patterns_through_slices_and_emulate_on_cpu(tmp_path):
    check(pipeline(tmp_path / "job", "cpu", ["--backend", "nccl"]))
