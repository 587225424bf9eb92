"""`prism.bench.fidelity_paired`: a prism run is scored against the truth interpolated at its own minute."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import job as job_files
from prism.bench import fidelity_paired
from prism.bench.fidelity_table import Config, Result, write_json


def _events(path: Path, start_s: float, cpu_ns: int) -> None:
    """Two ranks, iterations 0-2, one compute event each: began at `start_s` (host monotonic)."""
    rows = [(r, it, int(start_s * 1e9) + it * 1000) for r in (0, 1) for it in range(3)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "rank": [r for r, _, _ in rows], "seq": [it for _, it, _ in rows], "kind": ["compute"] * len(rows),
        "iteration": [it for _, it, _ in rows], "t_start_ns": [t for _, _, t in rows],
        "t_end_ns": [t + cpu_ns for _, _, t in rows], "device_ns": [cpu_ns] * len(rows)}), path)


def test_a_run_is_scored_against_the_truth_between_the_runs_around_it(tmp_path):
    cfg = Config("dp2", 2, ("--dp", "2"), 1)
    stream = tmp_path / "a"
    # truths at t=0 s (100 ms, CPU 1000 ns) and t=10 s (120 ms, CPU 2000 ns); prism runs at t=2.5 and t=7.5
    _events(job_files.graph_file(stream / "dp2" / "truth0"), 0.0, 1000)
    _events(job_files.graph_file(stream / "dp2" / "truth1"), 10.0, 2000)
    _events(job_files.slice_dir(stream / "dp2" / "prism0", 0) / "events.parquet", 2.5, 1250)
    _events(job_files.slice_dir(stream / "dp2" / "prism1", 0) / "events.parquet", 7.5, 1500)
    write_json(stream / "fidelity.json", [Result(cfg, 1, truth_ms=[100.0, 120.0], pred_ms=[105.0, 115.0],
                                                 variant=["none", "mirror"])])
    rows = fidelity_paired.config_runs(stream / "dp2", [100.0, 120.0], [105.0, 115.0], ["none", "mirror"])
    assert [r["truth_ms"] for r in rows] == pytest.approx([105.0, 115.0])
    assert [r["error_pct"] for r in rows] == pytest.approx([0.0, 0.0])
    assert [r["cpu"] for r in rows] == pytest.approx([1250 / 1250, 1500 / 1750])
    assert [r["load"] for r in rows] == ["none", "mirror"] and {r["gap"] for r in rows} == {1}
    text = "\n".join(fidelity_paired.report([stream]))
    assert "| a | dp2 | 1 | mirror | 7.5 | 115.00 | 115.00 | +0.0 | 0.857 |" in text
    assert "| a | dp2 | 1 | mirror | -0.0 | -0.143 |" in text or "| a | dp2 | 1 | mirror | +0.0 | -0.143 |" in text


def test_outside_the_truths_the_nearest_truth_counts():
    assert fidelity_paired.interpolate([0.0, 10.0], [1.0, 2.0], 12.0) == 2.0
    assert fidelity_paired.interpolate([0.0, 10.0], [1.0, 2.0], -1.0) == 1.0


def test_the_compute_fit_says_how_much_of_the_error_the_slices_compute_speed_explains():
    # errors exactly the compute term (slices 5 % slow -> +5 %): r 1, slope 1, nothing left
    assert fidelity_paired.compute_fit([5.0, -3.0, 0.0], [1.05, 0.97, 1.0]).replace("-0.0", "+0.0") == \
        "1.00, 1.00, +0.0 | +0.0, 0.0"
    # a constant 2 % on top of it: the intercept and what is left say so
    assert fidelity_paired.compute_fit([7.0, -1.0, 2.0], [1.05, 0.97, 1.0]) == "1.00, 1.00, +2.0 | +2.0, 2.0"
    # too few runs for a line: only what is left
    assert fidelity_paired.compute_fit([4.0], [1.01]) == "- | +3.0, 3.0"
