"""Emulate = capture, bitwise, for the autograd features real frameworks put collectives in (issue 21, item 2;
tests/programs/autograd_features.py): DTensor redistribute inside a selective-checkpoint region, functional
collectives with autograd (eager under SAC, and compiled with torch.compile's aot_eager backend), pipelining's
interleaved 1F1B with SAC stages and 1F1B with full AC, FSDP2's reshard_after_forward True / False / 2 with
full AC and SAC blocks. The sandbox ranks print, bitwise, what they printed in the capture, and the capture
prints what torchrun prints (within 1e-5 relative: prism's reduction order is not gloo's). Features covered
elsewhere: full AC, SAC with a policy, compiled blocks, FSDP2 x TP (test_framework_patterns.py); GPipe and
1F1B without AC, DTensor TP (test_emulate_mode.py). Async TP does not run on CPU (docs/frameworks.md)."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, close_lines, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow

PROG = str(PROGRAMS / "autograd_features.py")
CASES = [  # id, ranks, features, sandbox, the sections the sandbox must print
    ("redistribute-functional-pipeline", 2, "redistribute,functional,pipeline", "1",
     ["redistribute_loss1", "functional_loss1", "interleaved_loss1", "1f1b_loss1", "1f1b_w"]),
    ("reshard", 4, "reshard", "1,2", ["reshard_loss1", "reshard_w"]),
]


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    return sorted(line for line in lines if ranks is None or int(line.split()[2]) in ranks)


@pytest.mark.parametrize("name, nproc, features, sandbox, sections", CASES, ids=[c[0] for c in CASES])
def test_emulated_sandbox_repeats_the_capture_bitwise(tmp_path, name, nproc, features, sandbox, sections):
    job = tmp_path / "job"
    prog = [PROG, "--features", features]

    def capture_emulate():
        cap = run_prism(["launch", "--nproc", str(nproc), "--mode", "capture", "--devices", "2",
                         "--out", str(job / "capture"), *prog], timeout=300)
        assert cap.returncode == 0, cap.stderr[-3000:]
        return cap, run_prism(["launch", "--nproc", str(nproc), "--mode", "emulate", "--capture",
                               str(job / "capture"), "--sandbox", sandbox, "--out", str(job / "emu"), *prog],
                              timeout=300)

    (cap, emu), ref = run_together(capture_emulate, lambda: run_torchrun(nproc, prog, timeout=300))
    assert emu.returncode == 0, emu.stderr[-3000:]
    members = {int(r) for r in sandbox.split(",")}
    got = _results(emu.stdout)
    assert got == _results(cap.stdout, members)
    printed = {line.split()[1] for line in got}
    assert set(sections) <= printed, printed
    assert {int(line.split()[2]) for line in got} == members
    assert ref.returncode == 0, ref.stderr[-3000:]
    want, mine = _results(ref.stdout), _results(cap.stdout)
    assert len(want) == len(mine)
    for a, b in zip(mine, want):
        assert close_lines(a, b, 1e-5), (a, b)
