"""Members of a collective that pass the same element count in different shapes (tests/programs/shapes_by_count.py;
DeepSpeed's pipeline engine does it with its loss): gloo carries them, so must capture (a "sizes differ"
mismatch before) and emulate; each member's result keeps its own shape."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow

PROG = [str(PROGRAMS / "shapes_by_count.py")]


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    return sorted(line for line in lines if ranks is None or int(line.split()[2]) in ranks)


def test_capture_and_emulate_carry_equal_counts_in_different_shapes(tmp_path):
    job = tmp_path / "job"

    def capture_emulate():
        cap = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out",
                         str(job / "capture"), *PROG])
        assert cap.returncode == 0, cap.stderr[-3000:]
        emus = [run_prism(["launch", "--nproc", "2", "--mode", "emulate", "--capture", str(job / "capture"),
                           "--sandbox", s, "--out", str(job / f"emu{s}"), *PROG]) for s in ("0", "1")]
        return cap, emus

    (cap, emus), ref = run_together(capture_emulate, lambda: run_torchrun(2, PROG))
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = _results(ref.stdout)
    assert len(want) == 12
    assert {"result loss0 0 [] 4.00000000e+00", "result loss0 1 [1] 4.00000000e+00"} <= set(want)
    assert _results(cap.stdout) == want  # two members: prism's sum is gloo's, bitwise
    for sandbox, emu in enumerate(emus):
        assert emu.returncode == 0, emu.stderr[-3000:]
        assert _results(emu.stdout) == _results(cap.stdout, {sandbox})
