"""The report of a large job stays readable: compute/communication/idle as % of one iteration (not sums over
iterations), the timeline of every rank aggregated by pipeline stage with a drill-down to chosen ranks, and the page
of a W=1024 job in headless Chromium."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest

from prism.report import data, occupancy
from prism.report.html import build
from prism.report.stage import main as report_main
from tests.browser import open_page, plots_without_data
from tests.report_job import COMPUTE_NS, make_job, make_wide_job


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return make_wide_job(tmp_path_factory.mktemp("wide") / "wide1024", world=1024, stages=4)


def test_occupancy_is_the_exact_share_of_the_class_time():
    # two ranks of one class over [0, 100): rank 0 computes [0, 50), rank 1 [0, 100) then nothing
    events = pl.DataFrame({"rank": [0, 1], "kind": ["compute", "compute"], "start_ns": [0, 0], "end_ns": [50, 100]})
    classes = pl.DataFrame({"rank": [0, 1], "class": ["all ranks"] * 2}, schema={"rank": pl.Int64, "class": pl.String})
    occ = occupancy.occupancy(events, classes, 0, 100, bins=2)
    assert occ["compute"].to_list() == [1.0, 0.5] and occ["none"].to_list() == [0.0, 0.5]
    assert occ["t_us"].to_list() == [0.025, 0.075]
    # a wait across a bin edge is split exactly
    events = pl.DataFrame({"rank": [0], "kind": ["wait"], "start_ns": [30], "end_ns": [80]})
    occ = occupancy.occupancy(events, classes.head(1), 0, 100, bins=4)
    assert np.allclose(occ["wait"].to_numpy(), [0.0, 0.8, 1.0, 0.2])


def test_shares_are_per_iteration_and_add_up(tmp_path):
    job = make_job(tmp_path / "j", baseline=False)
    calibrated = data.load_timeline(job, "calibrated")
    iterations = pl.read_parquet(job / "calibrated" / "iterations.parquet")
    shares = data.iteration_shares(data.time_breakdown(calibrated.events, None), iterations)
    rank1 = shares.filter(pl.col("rank") == 1).row(0, named=True)
    assert rank1["compute_ms"] == pytest.approx(COMPUTE_NS[1] / 1e6)  # one iteration's compute, not two summed
    assert rank1["n"] == 2
    for row in shares.iter_rows(named=True):
        total = row["compute_pct"] + row["communication_pct"] + row["idle_pct"] + row["other_pct"]
        assert total == pytest.approx(100, abs=0.01) and 0 < row["compute_pct"] < 100


def test_drawn_ranks_are_few_at_scale():
    path = pl.DataFrame({"rank": [900, 900, 17]})
    assert occupancy.chosen_ranks(16, path) == list(range(16))
    assert occupancy.chosen_ranks(1024, path) == [0, 17, 900, 1023]
    assert occupancy.chosen_ranks(1024, path, asked=[5, 3, 4000]) == [3, 5]



def test_w1024_report_is_aggregated_and_opens_clean(wide, tmp_path):
    page = build(wide)
    assert "PP4 × DP256" in page and ">1024<" in page  # the header
    assert "every rank, by class" in page and "stage 3 (256 ranks)" in page
    drilled = re.search(r"Ranks drawn one by one below: ([0-9, ]+) \(", page).group(1).split(", ")
    assert len(drilled) <= 10 and "0" in drilled and "1023" in drilled
    assert len(page) < 8 * 2**20  # the page stays small: no bar per event of every rank
    out = tmp_path / "report.html"
    out.write_text(page)
    result = open_page(out, tmp_path, height=6000)
    assert result.errors == []
    n_plots, empty = plots_without_data(result.dom)
    assert n_plots >= 5 and empty == []


def test_drill_down_to_chosen_ranks(wide, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert report_main(["--job", str(wide), "--out", str(out), "--ranks", "3,517"]) == 0
    page = out.read_text()
    assert "Ranks drawn one by one below: 3, 517 (" in page
    ys = set(re.findall(r'"rank (\d+)"', page))
    assert ys == {"3", "517"}, ys
    with pytest.raises(SystemExit):
        report_main(["--job", str(wide), "--ranks", "three"])
    assert "rank numbers separated by commas" in capsys.readouterr().err
