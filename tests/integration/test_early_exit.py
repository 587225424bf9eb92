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
