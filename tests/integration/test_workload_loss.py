"""Every parallel layout of the reference workload trains like one process.

Each layout runs 3 steps on gloo under ``python -m torch.distributed.run``; its per-step losses (stdout)
and global gradient norms (stderr) must equal those of a single process within 1e-5 relative.
The single process sees the same global batch: by the workload's data rule the batch of a step depends
only on B = microbatches * dp * micro-batch-size (here 8), not on how it is split.
The gradient norm is checked too because AdamW is nearly invariant to a constant gradient scale, so a
wrong DP/EP averaging factor would hardly show in the loss.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_torchrun

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
RTOL = 1e-5
REFERENCE = ["--microbatches", "1", "--micro-batch-size", "8"]   # B = 8 in one microbatch

LAYOUTS = {   # name: (ranks, flags); every one has microbatches * dp * micro-batch-size = 8
    "tp2": (2, ["--tp", "2", "--microbatches", "4"]),
    "pp2": (2, ["--pp", "2", "--microbatches", "4"]),
    "dp2": (2, ["--dp", "2", "--microbatches", "2"]),
    "dp2-ep2": (2, ["--dp", "2", "--ep", "2", "--microbatches", "2"]),
    "dp4-ep2": (4, ["--dp", "4", "--ep", "2", "--microbatches", "1"]),   # expert grads all-reduced over edp
    "tp2-pp2": (4, ["--tp", "2", "--pp", "2", "--microbatches", "4"]),
    "tp2-pp2-dp2-ep2": (8, ["--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--microbatches", "2"]),
}
VAR_SEQ = (2, ["--dp", "2", "--ep", "2", "--microbatches", "2", "--var-seq"])


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the workload as one plain process (torchrun's runs: tests.conftest.run_torchrun); kill it on timeout."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    base.update(OMP_NUM_THREADS="1", **(env or {}))
    cmd = [sys.executable, "-m", "prism.workloads.moe_gpt", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # our own session
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {TIMEOUT_S}s\n{err[-3000:]}")
    return proc.returncode, out, err


def metrics(out: str, err: str) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """{step: [loss per printing rank]}, {step: [grad norm per printing rank]}; stdout must hold only loss lines."""
    losses: dict[int, list[float]] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"step=(\d+) loss=(-?\d+\.\d{8})", line)
        assert m, f"unexpected stdout line {line!r}"
        losses.setdefault(int(m[1]), []).append(float(m[2]))
    norms: dict[int, list[float]] = {}
    for m in re.finditer(r"step=(\d+) grad_norm=(\S+)", err):
        norms.setdefault(int(m[1]), []).append(float(m[2]))
    return losses, norms


def train(args: list[str], nproc: int | None = None) -> tuple[dict, dict]:
    if nproc is None:
        rc, out, err = run(args)
    else:  # torchrun's run of a layout is shared with test_capture's reference of the same layout
        proc = run_torchrun(nproc, ["-m", "prism.workloads.moe_gpt", *args], timeout=TIMEOUT_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    assert rc == 0, f"exit {rc}\n{err[-4000:]}"
    return metrics(out, err)


@pytest.fixture(scope="module")
def reference() -> dict[bool, tuple[dict, dict]]:
    cache: dict[bool, tuple[dict, dict]] = {}

    def get(var_seq: bool) -> tuple[dict, dict]:
        if var_seq not in cache:
            cache[var_seq] = train(REFERENCE + (["--var-seq"] if var_seq else []))
        return cache[var_seq]
    return get


def assert_matches(got: tuple[dict, dict], ref: tuple[dict, dict], printers: int) -> None:
    for what, g, r in (("loss", got[0], ref[0]), ("grad_norm", got[1], ref[1])):
        assert sorted(g) == sorted(r) == [1, 2, 3], f"{what}: steps {sorted(g)} vs {sorted(r)}"
        for step, values in g.items():
            assert len(values) == printers, f"{what} step {step}: {len(values)} lines, expected {printers}"
            for v in values:
                assert v == pytest.approx(r[step][0], rel=RTOL), \
                    f"{what} step {step}: {v} vs single process {r[step][0]}"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference):
    nproc, flags = LAYOUTS[name]
    dp = int(flags[flags.index("--dp") + 1]) if "--dp" in flags else 1
    assert_matches(train(flags, nproc), reference(False), printers=dp)   # tp_idx 0 of the last stage, per DP rank


def test_var_seq_matches_single_process(reference):
    ref = reference(True)
    assert ref[0] != reference(False)[0], "--var-seq should change the batch"
    assert_matches(train(VAR_SEQ[1], VAR_SEQ[0]), ref, printers=2)


def test_microbatching_does_not_change_the_loss(reference):
    assert_matches(train(["--microbatches", "4", "--micro-batch-size", "2"]), reference(False), printers=1)


@pytest.mark.parametrize("world, flags, fragment", [
    ("3", ["--tp", "2"], "--tp 2"),
    ("4", ["--dp", "4", "--ep", "3"], "--ep 3 must divide --dp 4"),
    ("3", ["--tp", "3"], "--heads 4 must be divisible by --tp 3"),
    ("2", ["--dp", "4"], "--dp 4"),
])
def test_bad_layout_exits_2_with_one_message(world, flags, fragment):
    rc, out, err = run(flags, env={"WORLD_SIZE": world, "RANK": "0"})
    assert rc == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moe_gpt: error:") and fragment in lines[0], err
