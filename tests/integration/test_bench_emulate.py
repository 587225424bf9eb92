"""`prism bench emulate` smoke test: the smallest size (W=16 captured on P=2, one sandbox rank)."""

from __future__ import annotations

import pytest

from tests.conftest import run_prism


def test_unknown_size_is_refused():
    proc = run_prism(["bench", "emulate", "--sizes", "12"], timeout=60)
    assert proc.returncode == 2 and "no layout for W=[12]" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # a W=16 capture on P=2, its graph, calibration and emulation
def test_smallest_size(tmp_path):
    proc = run_prism(["bench", "emulate", "--sizes", "16", "--steps", "2", "--out", str(tmp_path)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-2].split()[:2] == ["W", "layout"]
    row = lines[-1].split()
    assert row[0] == "16" and row[2] == "8"  # the default sandbox: tp=0, dp=0 of the last stage (pp=1)
    startup, pss, communicators, per_iteration = float(row[3]), float(row[4].rstrip("G")), int(row[5]), float(row[6])
    assert 0 < startup and 0 < pss < 16 and 0 < communicators < 16 and 0 < per_iteration


def test_synthetic_timed_replay_writes_json(tmp_path):
    """`--synthetic`: the timed replay alone on a synthetic calibrated job (no capture); the JSON holds the
    cone and the check that the virtual arrivals at the real ops are exactly the calibrated ones."""
    out = tmp_path / "emulate.json"
    proc = run_prism(["bench", "emulate", "--synthetic", "--sizes", "16", "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert doc["command"].startswith("prism bench emulate --synthetic") and row["W"] == 16
    assert row["arrivals_off_calibrated"] == 0 and 0 < row["cone_live_events"] <= row["virtual_events"]
    assert proc.stdout.strip().splitlines()[-1].split()[0] == "16"
    again = run_prism(["bench", "emulate", "--summarize", str(out)], timeout=60)  # the table from the JSON alone
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == proc.stdout.strip().splitlines()[-1]


def test_reuse_needs_out():
    proc = run_prism(["bench", "emulate", "--sizes", "16", "--reuse"], timeout=60)
    assert proc.returncode == 2 and "--reuse needs --out" in proc.stderr
