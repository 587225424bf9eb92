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


@pytest.mark.parametrize("dtype,layouts,live", [("int32", "gloo,ring", "0,1"), ("float32", "gloo,ring16,ring", "0,2")])
def test_burst_runs_the_runtimes_ring_against_gloo(tmp_path, dtype, layouts, live):
    """`--burst` (session 17): the runtime's neighbours ring and gloo's all-reduce, a row each a layout; with an
    integer dtype every slice rank checks its result is the exact sum (it exits non-zero otherwise)."""
    out = tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "replay_ring.py"), "--burst", "3", "--bursts", "3",
                           "--members", "4", "--live", live, "--bytes", "4100", "--dtype", dtype, "--layouts", layouts,
                           "--cores", "0", "--server-cores", "0", "--out", str(out), "--table"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["layout"] for r in rows] == layouts.split(",")
    for r in rows:
        assert "error" not in r, (r, proc.stderr)
        assert r["op_us"] > 0
    ring = rows[-1]
    assert {k for k in ring if k.startswith("slice")} == {f"slice{p}" for p in live.split(",")}
    assert ring["server"]["cpu_us_per_op_total"] > 0
    assert "ring / gloo: median" in proc.stdout
