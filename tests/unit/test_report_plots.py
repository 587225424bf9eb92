"""The report's timeline lists ranks in rank order whatever order their events come in."""

from __future__ import annotations

import polars as pl

from prism.report import plots


def test_gantt_lists_ranks_in_rank_order():
    # rank 10 starts first, then 2, then 0: drawn in that order, listed 0, 2, 10 (not "rank 10" < "rank 2")
    events = pl.DataFrame({"rank": [10, 2, 0], "kind": ["compute"] * 3, "op": ["mm"] * 3, "seq": [0, 0, 0],
                           "start_ns": [0, 100, 200], "end_ns": [50, 150, 250]})
    fig = plots.gantt(events, None, "t")
    assert list(fig.layout.yaxis.categoryarray) == ["rank 0", "rank 2", "rank 10"]
    assert fig.layout.yaxis.autorange == "reversed"  # rank 0 on top
