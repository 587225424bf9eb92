"""Unmodified public-API programs run under prism exactly as under plain torchrun.

Each program in tests/programs/ (DDP, FSDP2, DTensor TP, FSDP2 x TP, pipelining, functional collectives,
all-to-all / p2p / async collectives, torch.compile(DDP)) runs twice: under `torchrun` on gloo and under
`prism launch --out`. Both must succeed and print the same `result` lines (prism delegates the data
movement to gloo, so the values are bitwise equal; a 1e-6 relative tolerance is allowed for floats), and
prism must have recorded each rank's trace with at least one collective, the ops the program makes, and
at most one wait event per op.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import PROGRAMS, run_in_session, run_together, run_torchrun

pytestmark = pytest.mark.slow

TIMEOUT_S = 120
RESULT = re.compile(r"^result (\S+) (\d+)(?: (.*))?$")

FUNCTIONAL_OPS = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
                  "all_reduce_coalesced", "broadcast"}

# program, ranks, arguments, ops its trace must contain (on some rank)
CASES = [
    ("ddp", 2, [], {"all_reduce", "broadcast"}),
    ("fsdp2", 2, [], {"all_gather_into_tensor", "reduce_scatter_tensor"}),
    ("dtensor_tp", 2, [], {"all_reduce", "all_gather_into_tensor"}),
    ("fsdp_tp", 4, [], {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"}),
    ("pipelining", 2, ["--schedule", "both"], {"send", "recv"}),
    ("functional", 2, ["--compile", "aot_eager"], FUNCTIONAL_OPS),
    pytest.param("functional", 2, ["--compile", "inductor"], FUNCTIONAL_OPS, id="functional_inductor",
                 marks=pytest.mark.skipif(not os.environ.get("PRISM_TEST_INDUCTOR"),
                                          reason="inductor costs ~1 min under prism on 2 cores: each Python subprocess "
                                                 "a rank spawns re-imports torch via sitecustomize "
                                                 "(set PRISM_TEST_INDUCTOR=1)")),
    ("alltoall", 2, [], {"all_to_all_single", "all_to_all", "send", "recv", "broadcast", "reduce", "gather",
                         "scatter", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                         "reduce_scatter_tensor", "all_gather_coalesced", "barrier"}),
    ("ddp_compile", 2, [], {"all_reduce"}),
]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run `cmd` in its own session; on timeout, kill the whole session (torchrun's workers too)."""
    try:
        return run_in_session(cmd, TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {TIMEOUT_S} s (a hang?): {' '.join(cmd)}\n--- stderr tail:\n{e.stderr[-4000:]}")


def results(proc: subprocess.CompletedProcess) -> dict[tuple[str, int], list[str]]:
    """The program's `result <name> <rank> <values...>` lines, by (name, rank)."""
    found: dict[tuple[str, int], list[str]] = {}
    for line in proc.stdout.splitlines():
        m = RESULT.match(line.strip())
        if m:
            key = (m.group(1), int(m.group(2)))
            assert key not in found, f"result {key} printed twice"
            found[key] = (m.group(3) or "").split()
    return found


def same_value(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12)


def assert_ok(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, (
        f"{what} exited with {proc.returncode}\n--- stdout tail:\n{proc.stdout[-2000:]}"
        f"\n--- stderr tail:\n{proc.stderr[-6000:]}"
    )


def read_events(path: Path) -> pa.Table:
    with pa.ipc.open_stream(str(path)) as reader:
        return reader.read_all()


@pytest.mark.parametrize("program,nproc,args,ops", CASES,
                         ids=[c[0] if isinstance(c, tuple) else c.id for c in CASES])
def test_program_matches_torchrun(program: str, nproc: int, args: list[str], ops: set[str],
                                  tmp_path: Path) -> None:
    script = str(PROGRAMS / f"{program}.py")
    out = tmp_path / "job"
    ref, got = run_together(  # (torchrun's run is shared with test_public_api_capture)
        lambda: run_torchrun(nproc, [script, *args], timeout=TIMEOUT_S),
        lambda: run([sys.executable, "-m", "prism.cli", "launch", "--nproc", str(nproc), "--out", str(out), script,
                     *args]))
    assert_ok(ref, "torchrun")
    assert_ok(got, "prism launch")

    expected, actual = results(ref), results(got)
    assert expected, f"torchrun printed no result lines:\n{ref.stdout[-2000:]}"
    assert {rank for _, rank in expected} == set(range(nproc)), "every rank reports a result"
    assert sorted(actual) == sorted(expected), "prism's run reports other results than torchrun's"
    for key, values in expected.items():
        assert len(actual[key]) == len(values) and all(map(same_value, values, actual[key])), (
            f"result {key[0]} of rank {key[1]}: torchrun {values} != prism {actual[key]}"
        )

    seen_ops: set[str] = set()
    for rank in range(nproc):
        path = out / "raw" / f"rank={rank}" / "events.arrow"
        assert path.is_file(), f"no trace for rank {rank}: {path}"
        events = read_events(path)
        kinds = events.column("kind").to_pylist()
        assert kinds.count("collective") >= 1, f"rank {rank} recorded no collective"
        comm = {op for kind, op in zip(kinds, events.column("op").to_pylist())
                if kind in ("collective", "send", "recv")}
        seen_ops |= comm
        waited = [w for kind, w in zip(kinds, events.column("work_id").to_pylist()) if kind == "wait"]
        assert len(waited) == len(set(waited)), f"rank {rank}: an op has several wait events"
    assert ops <= seen_ops, f"ops the program makes but the trace lacks: {sorted(ops - seen_ops)}"
