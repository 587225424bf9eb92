"""Real mode over NCCL: prism's backend gives the results of `--mode off` for every op on CUDA tensors.

`tests/gpu/programs/nccl_ops.py` runs every collective and p2p op, sync and async (the blocking API, where
NCCL returns no work, async works, futures, the coalescing manager, batch_isend_irecv, functional
collectives, DDP), and the reference workload runs its layouts, each under `prism launch --mode off` and
`--mode real --out` on NCCL. W=1 (one GPU: NCCL groups of one member, the same wait/future path) always;
W=2 (p2p, DP and TP layouts) where the host has 2 GPUs. Results equal within 1e-6 relative.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import REPO, make_env
from tests.gpu.gpu_env import NCCL_ENV, gpu_count, requires_cuda
from tests.integration.test_public_api import results, same_value

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

PROGRAM = Path(__file__).parent / "programs" / "nccl_ops.py"
TIMEOUT_S = 300
WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--device", "cuda", "--backend", "nccl", "--steps", "2"]
LAYOUTS = {"w1": (1, ["--microbatches", "2"]), "dp2": (2, ["--dp", "2", "--microbatches", "2"]),
           "tp2": (2, ["--tp", "2", "--microbatches", "2"]), "pp2": (2, ["--pp", "2", "--microbatches", "2"])}


def launch(nproc: int, mode: str, target: list[str], out: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(nproc), "--mode", mode]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd + target, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env=make_env(PRISM_DEVICE="cuda", **NCCL_ENV))
    assert proc.returncode == 0, f"{mode} W={nproc} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    return proc


def read_events(path: Path) -> pa.Table:
    with pa.ipc.open_stream(str(path)) as reader:
        return reader.read_all()


def check_trace(out: Path, nproc: int, collectives: bool = True) -> None:
    for rank in range(nproc):
        ev = read_events(out / "raw" / f"rank={rank}" / "events.arrow")
        kinds = ev.column("kind").to_pylist()
        assert not collectives or kinds.count("collective") >= 1, f"rank {rank} recorded no collective"
        waited = [w for k, w in zip(kinds, ev.column("work_id").to_pylist()) if k == "wait"]
        assert len(waited) == len(set(waited)), f"rank {rank}: an op has several wait events"
        for col in ("cpu_ns", "device_ns"):
            bad = [(s, k, v) for s, k, v in zip(ev.column("seq").to_pylist(), kinds, ev.column(col).to_pylist())
                   if v < -1]
            assert not bad, f"rank {rank}: negative {col} {bad[:3]}"


@pytest.mark.parametrize("nproc", [1, 2])
def test_every_op_equals_mode_off(nproc: int, tmp_path: Path) -> None:
    if gpu_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    ref = results(launch(nproc, "off", [str(PROGRAM)]))
    got = results(launch(nproc, "real", [str(PROGRAM)], tmp_path / "job"))
    assert ref and sorted(got) == sorted(ref), f"other results: {sorted(set(ref) ^ set(got))}"
    for key, vals in ref.items():
        assert len(got[key]) == len(vals) and all(map(same_value, vals, got[key])), (
            f"{key}: off {vals} != real {got[key]}")
    check_trace(tmp_path / "job", nproc)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_workload_layout_equals_mode_off(layout: str, tmp_path: Path) -> None:
    nproc, flags = LAYOUTS[layout]
    if gpu_count() < nproc:
        pytest.skip(f"needs {nproc} GPUs")
    ref = [w for w in launch(nproc, "off", WORKLOAD + flags).stdout.split() if w.startswith("loss=")]
    got = [w for w in launch(nproc, "real", WORKLOAD + flags, tmp_path / "job").stdout.split()
           if w.startswith("loss=")]
    assert ref, "the workload printed no loss"
    assert len(got) == len(ref) and all(same_value(a[5:], b[5:]) for a, b in zip(ref, got)), (
        f"off {ref} != real {got}")
    check_trace(tmp_path / "job", nproc, collectives=nproc > 1)  # one rank: the workload communicates not
