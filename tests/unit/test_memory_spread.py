"""The memory-fidelity judgement of the GPU test (tests/gpu/memory_fidelity.py), on hand values: capture's
peak against the truth's min-max over several real runs, with the 0.01 % goal as slack; the OOM limit
separates the top rank from the others in every real run."""

from __future__ import annotations

from tests.gpu import memory_fidelity as mf


def test_capture_inside_the_truths_spread():
    # session 5, call 3: dp4-ep2 rank 1's truth was 70,293,504 in two calls and 70,364,160 in one
    assert mf.within(70_293_504, 70_293_504, 70_364_160)
    assert mf.within(70_364_160, 70_293_504, 70_364_160)
    # a truth that did not vary: within 0.01 % of it, no more
    assert mf.within(70_000_000 + 6_999, 70_000_000, 70_000_000)
    assert not mf.within(70_000_000 + 7_001, 70_000_000, 70_000_000)
    assert not mf.within(70_293_504, 70_364_160, 70_364_160)  # the max alone: 0.10 % off
    assert round(mf.error_pct(70_293_504, 70_364_160), 4) == 0.1004


def test_oom_limit_uses_the_top_ranks_smallest_peak():
    rows = [{"layout": mf.OOM_LAYOUT, "rank": r, "real_peak_allocated": a, "real_peak_allocated_min": lo,
             "real_peak_reserved": res} for r, a, lo, res in
            [(0, 1000, 900, 1100), (1, 600, 600, 700), (2, 500, 500, 800)]]
    rank, gb = mf.oom_limit(rows)
    assert rank == 0 and gb * mf.GIB == (800 + 900) / 2
