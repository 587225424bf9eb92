"""Capture mode runs the public-API programs unmodified: W ranks on P=1 and P=2 slots print what plain
torchrun prints (results computed by prism's own collective semantics)."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, close_lines, run_prism, run_together, run_torchrun

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


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """A program's captures on P=1 and P=2 slots and its torchrun reference, run at once (independent runs; a
    capture on one slot computes on one core): {devices: CompletedProcess}, torchrun's."""
    done: dict[str, tuple] = {}

    def get(name: str, nproc: int, args: list[str]):
        if name not in done:
            prog = str(PROGRAMS / f"{name}.py")
            jobs = [tmp_path_factory.mktemp(f"{name}-p{devices}") / "job" for devices in (1, 2)]
            *caps, ref = run_together(
                *(lambda devices=devices, job=job: run_prism(["launch", "--nproc", str(nproc), "--mode", "capture",
                                                              "--devices", str(devices), "--out", str(job), prog,
                                                              *args])
                  for devices, job in zip((1, 2), jobs)),
                lambda: run_torchrun(nproc, [prog, *args]))  # once per session (test_public_api runs the same)
            done[name] = dict(zip((1, 2), caps)), ref
        return done[name]
    return get


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("name, nproc, args", CASES, ids=[c[0] for c in CASES])
def test_capture_prints_what_torchrun_prints(captures, name, nproc, args, devices):
    caps, ref = captures(name, nproc, args)
    assert ref.returncode == 0, ref.stderr[-3000:]
    proc = caps[devices]
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = results(proc.stdout), results(ref.stdout)
    assert got and len(got) == len(want)
    for a, b in zip(got, want):
        assert close(a, b), (a, b)
