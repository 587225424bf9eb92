"""`prism bench fidelity` smoke test: one W=2 config (dp2, P=1), 2 truth runs, 1 prism run, small model.

Checks that the table is printed with sane positive numbers, that a rescore repeats it and writes its JSON,
and that --summarize of that JSON prints the same row -- not that the error is small (a 2-core box
is too noisy for that; docs/fidelity.md has the measured matrices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import run_prism

pytestmark = pytest.mark.slow


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the truth pins W=2 ranks to 2 cores")
def test_fidelity_smoke(tmp_path):
    proc = run_prism(["bench", "fidelity", "--configs", "dp2", "--repeats", "2", "--steps", "3", "--small",
                      "--out", str(tmp_path), "--work", str(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "| config | W | P | layout | truth ms |" in out
    rows = [line for line in out.splitlines() if line.startswith("| dp2 ")]
    assert len(rows) == 1, out
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:3] == ["2", "1"], cells
    truth, prism, bare = float(cells[4]), float(cells[6]), float(cells[12])
    lo, hi = (float(x) for x in cells[5].split("-"))
    assert 0 < lo <= truth <= hi, cells
    assert prism > 0 and bare > 0, cells
    assert cells[8] in ("yes", "no") and cells[11] == "yes", cells  # capture and real graphs align
    start_med, start_p95 = (float(x) for x in cells[9].split("/"))
    assert 0 <= start_med <= start_p95, cells
    assert "mean |error|" in out
    result = json.loads((tmp_path / "fidelity.json").read_text())
    assert result[0]["error"] is None and len(result[0]["truth_ms"]) == 2
    (emulated,) = result[0]["emulated"]  # the emulated sandbox ran: dp2 on P=1, a slice is one rank
    assert emulated.get("error") is None and emulated["rank"] == 0 and emulated["sandbox_ranks"] == [0], emulated
    assert emulated["sandbox_ms"] > 0 and not result[0]["pred_untimed_ms"], result[0]  # one pass by default
    assert (tmp_path / "fidelity.md").is_file()
    # every launch forked its zygote from the bench's warm template (a truth run, the capture, a slice run's own
    # meta is gone with its staging; the emulation's is kept)
    for meta in (tmp_path / "dp2" / "truth0" / "raw" / "meta.json", tmp_path / "dp2" / "prism0" / "capture" / "raw" /
                 "meta.json", tmp_path / "dp2" / "prism0" / "emulation" / "meta.json"):
        assert json.loads(meta.read_text()).get("zygote") == "template", meta
    # every truth run's graph is kept (its raw events are not): two real runs of one session to compare
    assert (tmp_path / "dp2" / "truth1" / "graph" / "events.parquet").is_file()
    assert not (tmp_path / "dp2" / "truth1" / "raw").exists()
    terms = subprocess.run([sys.executable, "-m", "prism.bench.fidelity_terms", str(tmp_path / "dp2" / "truth0"),
                            "--against", str(tmp_path / "dp2" / "truth1")], capture_output=True, text=True, timeout=60)
    assert terms.returncode == 0 and "| all " in terms.stdout, terms.stdout + terms.stderr

    # the saved runs calibrate again to the same row (nothing re-run; the truth comes from fidelity.json)
    rescored = tmp_path / "rescored"
    again = run_prism(["bench", "fidelity", "--rescore", str(tmp_path), "--out", str(rescored)], timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [line for line in again.stdout.splitlines() if line.startswith("| dp2 ")] == rows
    # ... and writes the JSON it scored: the table and the raw results are one thing
    (record,) = json.loads((rescored / "fidelity.json").read_text())
    assert record["pred_ms"] == result[0]["pred_ms"] and record["truth_ms"] == result[0]["truth_ms"]
    assert record["scored"]["at"]
    summary = run_prism(["bench", "fidelity", "--summarize", str(rescored / "fidelity.json")], timeout=60)
    assert summary.returncode == 0 and rows[0] in summary.stdout, summary.stdout + summary.stderr
