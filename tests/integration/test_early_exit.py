"""A rank that exits 0 while its peers still need it (issue 23: real mode said only "rank 0 failed with exit
code 1" and a gloo reset; capture says "rank 1 has exited (code 0)"): the launcher names the early exit."""

from __future__ import annotations

import pytest

from tests.conftest import PROGRAMS, run_prism

pytestmark = pytest.mark.slow


def test_real_mode_names_the_rank_that_exited_early():
    proc = run_prism(["launch", "--nproc", "2", "--hang-timeout", "5", str(PROGRAMS / "early_exit.py")],
                     timeout=120)
    assert proc.returncode not in (0, 86), proc.stderr[-3000:]
    assert "rank 1 has exited (code 0) while the others still ran" in proc.stderr, proc.stderr[-3000:]
    assert "rank 0 failed with" in proc.stderr

EARLY = "rank 1 has exited (code 0) while the others still ran"


def test_capture_names_the_rank_that_exited_early(tmp_path):
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "1", "--out", str(tmp_path / "cap"),
                      str(PROGRAMS / "early_exit.py")], timeout=120)
    assert proc.returncode == 86, proc.stderr[-3000:]
    assert "ranks 0,2-3 arrived with float32[4]; rank 1 has exited (code 0)" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "cap").exists()


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """A capture that runs through (its ranks exit early only under another mode)."""
    cap = tmp_path_factory.mktemp("early") / "cap"
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "1", "--out", str(cap),
                      str(PROGRAMS / "early_exit.py"), "--early-in", "none"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return cap


@pytest.mark.parametrize("mode,ranks", [("slice", ["--slice-ranks", "0,1"]), ("emulate", ["--sandbox", "1"]),
                                        ("emulate", ["--sandbox", "0,1"])])
def test_slice_and_emulate_name_the_rank_that_exited_early(capture, tmp_path, mode, ranks):
    """Issue 23: a rank that exits 0 early left only "replay worker failed ... Connection closed by peer"."""
    proc = run_prism(["launch", "--nproc", "4", "--mode", mode, "--capture", str(capture), *ranks, "--hang-timeout",
                      "5", "--out", str(tmp_path / "run"), str(PROGRAMS / "early_exit.py"), "--early-in", mode],
                     timeout=150)
    assert proc.returncode not in (0, 86), proc.stderr[-3000:]
    assert EARLY in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()
