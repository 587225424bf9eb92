"""Session 12's prototype of a replay server that plays only a live rank's two ring neighbours
(`scripts/replay_ring.py --neighbours`): the live member runs an N-member ring all-reduce against the server and
its result is the exact sum (the member exits non-zero otherwise), for N with equal and unequal chunks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("members,nbytes", [(4, 12928), (5, 12928), (3, 4)])
def test_neighbours_ring_is_exact(tmp_path, members, nbytes):
    out = tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "replay_ring.py"), "--members", str(members),
                           "--bytes", str(nbytes), "--neighbours", "--reps", "4", "--server-cores", "0",
                           "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert "error" not in row, (row, proc.stderr)
    assert row["layout"] == "neighbours" and row["members"] == members
    assert row["member0_median_ms"] > 0 and row["server_cpu_ms_per_op"] >= 0  # (os.times: 10 ms ticks)
