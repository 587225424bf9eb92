"""Capture mode runs the public-API programs unmodified: W ranks on P=1 and P=2 slots print what plain
torchrun prints (results computed by prism's own collective semantics)."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, close_lines, run_prism, run_torchrun

pytestmark = pytest.mark.slow

CASES = [  # program, ranks, arguments
    ("ddp", 2, []),
    ("fsdp2", 2, []),
    ("dtensor_tp", 2, []),
    ("fsdp_tp", 4, []),
    ("pipelining", 2, ["--schedule", "both"]),
    ("functional", 2, ["--compile", "aot_eager"]),
    ("alltoall", 2, []),  # uneven all_to_all_single, recv from any source, every collective async
]


def results(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("result "))


def close(a: str, b: str) -> bool:
    """Equal lines, numbers within 1e-6 relative (prism's reduction order differs from gloo's)."""
    return close_lines(a, b, 1e-6)


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("name, nproc, args", CASES, ids=[c[0] for c in CASES])
def test_capture_prints_what_torchrun_prints(tmp_path, name, nproc, args, devices):
    prog = str(PROGRAMS / f"{name}.py")
    ref = run_torchrun(nproc, [prog, *args])  # once per session (test_public_api runs the same)
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = run_prism(["launch", "--nproc", str(nproc), "--mode", "capture", "--devices", str(devices),
                      "--out", str(tmp_path / "job"), prog, *args])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = results(proc.stdout), results(ref.stdout)
    assert got and len(got) == len(want)
    for a, b in zip(got, want):
        assert close(a, b), (a, b)
