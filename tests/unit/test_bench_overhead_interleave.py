"""The statistics of `prism bench overhead --interleave` (PrismTrace switched off and on in one process by blocks
of steps): each on block against the mean of the off blocks either side, the median of those ratios with a
distribution-free interval, the pairs whose level changed, the pooled medians; and the schedule the ranks run."""

import random
from fractions import Fraction

import pytest

from prism.bench import interleave_rank, overhead
from prism.bench import overhead_stats as stats


def reference_interval(values, confidence):
    """The order-statistic interval by Pascal's triangle: [x_(k), x_(n+1-k)] covers the median with probability
    sum_{j=k}^{n-k} C(n, j) / 2^n (exact fractions); the largest k with coverage >= confidence."""
    n = len(values)
    row = [1]
    for _ in range(n):
        row = [a + b for a, b in zip([0] + row, row + [0])]
    best = None
    for k in range(1, n // 2 + 1 + 1):
        if k > n + 1 - k:
            break
        cover = Fraction(sum(row[k:n - k + 1]), 2 ** n)
        if cover >= Fraction(confidence).limit_denominator(1000):
            best = (k, cover)
    if best is None:
        return None
    x = sorted(values)
    return x[best[0] - 1], x[n - best[0]], float(best[1])


@pytest.mark.parametrize("n", list(range(1, 41)) + [57, 100])
def test_median_interval_is_the_order_statistics_a_binomial_gives(n):
    rng = random.Random(n)
    values = [rng.lognormvariate(0, 0.5) for _ in range(n)]
    got = stats.median_ci(values, 0.95)
    want = reference_interval(values, 0.95)
    if want is None:
        assert got == (float("-inf"), float("inf"), 1.0)
    else:
        assert got[:2] == want[:2] and got[2] == pytest.approx(want[2])
        assert got[2] >= 0.95
    if n == 6:
        assert got == (min(values), max(values), pytest.approx(1 - 2 / 64))


def test_median_interval_covers_the_true_median_as_often_as_it_says():
    rng = random.Random(7)
    true_median = 1.0  # lognormal(0, s): median e^0
    hits = trials = 0
    for _ in range(2000):
        lo, hi, cover = stats.median_ci([rng.lognormvariate(0, 0.8) for _ in range(15)], 0.95)
        hits += lo <= true_median <= hi
        trials += 1
    assert cover == pytest.approx(0.9648, abs=1e-4)  # n=15: k=4
    assert 0.95 <= hits / trials <= 0.98


def levels(n, switch_every, low=80.0, high=120.0):
    """A host whose speed level changes every `switch_every` steps (session 13/15 on the H200)."""
    return [low if (k // switch_every) % 2 == 0 else high for k in range(n)]


def test_pairs_cancel_a_level_that_holds_and_flag_the_ones_it_changes_in():
    n, cost = 61, 0.02
    on = [interleave_rank.is_on(k + 1, 1) for k in range(n)]
    base = levels(n, 10)
    durations = [b * (1 + cost) if o else b for b, o in zip(base, on)]
    res = stats.interleaved(durations, on, warm=0)
    # off on off ... off: 30 on steps, each with an off step either side
    assert len(res.ratios) == 30 and sum(on) == 30
    steady = [r for r, c in zip(res.ratios, res.changed) if not c]
    assert steady == pytest.approx([1 + cost] * len(steady))
    assert res.overhead == pytest.approx(cost)
    assert res.steady_overhead == pytest.approx(cost)
    # a level change between an on step's two off neighbours: 80 | 120 (or 120 | 80) across the triple
    changed = [k for k in range(1, n - 1, 2) if base[k - 1] != base[k + 1]]
    assert sum(res.changed) == len(changed) == 6
    # the ratio there is the on step over the two levels' mean, not the cost
    assert all(abs(r - 1 - cost) > 0.1 for r, c in zip(res.ratios, res.changed) if c)
    lo, hi, _ = res.ci()
    assert lo - 1e-9 <= cost <= hi + 1e-9


def test_a_level_that_changes_at_random_steps_leaves_the_steady_pairs_exact():
    # levels held for 4-15 steps, at 80 or 100-130 ms (session 15's host), on steps 3 % dearer
    rng = random.Random(3)
    base = []
    while len(base) < 400:
        base += [rng.choice([80.0, rng.uniform(100, 130)])] * rng.randint(4, 15)
    n, cost = 401, 0.03
    base = base[:n] + [80.0] * (n - len(base))
    on = [interleave_rank.is_on(k + 1, 1) for k in range(n)]
    durations = [b * (1 + cost) if o else b for b, o in zip(base, on)]
    res = stats.interleaved(durations, on, warm=4)
    assert len(res.ratios) == 198
    assert res.steady_overhead == pytest.approx(cost)
    assert 0 < sum(res.changed) < len(res.ratios) // 4
    lo, hi, _ = res.ci()
    assert lo - 1e-9 <= cost <= hi + 1e-9 and hi - lo < 0.005


def test_blocks_warm_up_and_a_plain_example():
    # block 2, off first: steps 1-2 off, 3-4 on, 5-6 off, 7-8 on, 9-10 off
    assert [interleave_rank.is_on(k, 2) for k in range(1, 11)] == [False, False, True, True] * 2 + [False, False]
    d = [50, 10, 11, 13, 10, 10, 12, 12, 12, 12]
    on = [interleave_rank.is_on(k, 2) for k in range(1, 11)]
    res = stats.interleaved(d, on, warm=1)  # step 1 (50 ms) left out; its block keeps step 2
    # pair 1: on median 12 / mean(10, 10) ; pair 2: on median 12 / mean(10, 12)
    assert res.ratios == pytest.approx([12 / 10, 12 / 11])
    assert res.changed == [False, True]  # 10 vs 12: 20 % apart, more than the 10 % level
    assert sorted(res.off_steps) == [10, 10, 10, 12, 12] and sorted(res.on_steps) == [11, 12, 12, 13]
    with pytest.raises(ValueError, match="3 step times for 2 states"):
        stats.interleaved([1, 2, 3], [False, True], 0)


def test_warnings_and_the_goal():
    few = stats.Interleaved([1.01] * 5, [False] * 5, [1.0], [1.0], 0.1)
    assert "too few" in stats.interleave_warnings(few)[0]
    assert "undecided" in stats.goal_verdict(few, 0.03)
    assert "no complete pair" in stats.interleave_warnings(stats.Interleaved([], [], [], [], 0.1))[0]
    wide = stats.Interleaved([0.9, 0.95, 1.0, 1.01, 1.02, 1.05, 1.1, 1.2], [False] * 8, [1.0], [1.0], 0.1)
    assert "not resolved from zero" in stats.interleave_warnings(wide)[0]
    assert "undecided" in stats.goal_verdict(wide, 0.03)
    tight = stats.Interleaved([1.010, 1.011, 1.012, 1.013, 1.014, 1.015, 1.016, 1.017], [False] * 8, [1.0], [1.0], 0.1)
    assert stats.interleave_warnings(tight) == []
    assert "met (the interval's upper end is +1.70 %)" in stats.goal_verdict(tight, 0.03)
    assert "missed (the interval's lower end is +1.00 %)" in stats.goal_verdict(tight, 0.005)


def test_the_interleaved_mode_checks_its_steps():
    with pytest.raises(SystemExit):
        overhead.main(["--interleave", "--steps", "6", "--block", "1"])  # warm-up 4 + off on off: 7
    assert overhead.interleave_warmup(1) == 4 and overhead.interleave_warmup(5) == 10


def test_ablations_take_turns_with_full_prismtrace_each_between_off_blocks():
    # block 1, two ablations: off, on, off, -memory, off, -bwd, off, on, ...
    got = [interleave_rank.state(k, 1, ["memory", "bwd"]) for k in range(1, 14)]
    assert got == [False, True, False, "memory", False, "bwd", False, True, False, "memory", False, "bwd", False]
    assert [interleave_rank.state(k, 2) for k in range(1, 9)] == [interleave_rank.is_on(k, 2) for k in range(1, 9)]
    # each state paired with the off steps either side of it; the off steps are every off step
    d = [10, 11, 10, 12, 10, 13, 10, 11, 10, 12, 10, 13, 10]
    full = stats.interleaved(d, got, warm=0)
    memory = stats.interleaved(d, got, warm=0, which="memory")
    bwd = stats.interleaved(d, got, warm=0, which="bwd")
    assert full.ratios == pytest.approx([1.1, 1.1]) and memory.ratios == pytest.approx([1.2, 1.2])
    assert bwd.ratios == pytest.approx([1.3, 1.3])
    assert sorted(full.on_steps) == [11, 11] and full.off_steps == memory.off_steps == [10] * 7
    runs = [{"durations": d, "on": got, "events": [0, 34, 0, 34, 0, 18] * 2 + [0]}]
    table = overhead.ablation_table(runs, ["memory", "bwd"], 0, 0.1)
    assert "DIAGNOSTIC, not the product's number" in table
    lines = {line.split()[0]: line.split() for line in table.splitlines() if line[:1] in ("f", "-")}
    assert lines["full"][4] == "+10.00%" and lines["-memory"][4] == "+20.00%" and lines["-bwd"][4] == "+30.00%"
    assert lines["-memory"][-1 - len(interleave_rank.ABLATIONS["memory"].what.split())] == "-1000", \
        "the part's cost: full's overhead less the ablation's, in us of the 10 ms off step"


def test_each_ablation_is_undone_exactly(tmp_path, monkeypatch):
    from prism.runtime import markers, recorder
    from prism.runtime.recorder import Recorder

    rec = Recorder(0, tmp_path)
    first_grad, cpu = markers._first_grad_tensor, recorder._cpu
    for name, part in interleave_rank.ABLATIONS.items():
        part.apply(rec)
        part.undo(rec)
        assert "marker" not in rec.__dict__ and "sample" not in rec.memory.__dict__, name
        assert markers._first_grad_tensor is first_grad and recorder._cpu is cpu, name
        assert not {"_saved_clock", "_saved_first_grad", "_saved_cpu"} & (set(rec.__dict__) | set(vars(markers))
                                                                          | set(vars(recorder))), name
    interleave_rank.ABLATIONS["memory"].apply(rec)
    assert rec.memory.sample() == (-1, -1, -1)
    interleave_rank.ABLATIONS["memory"].undo(rec)
    assert rec.memory.sample()[0] > 0
    with pytest.raises(SystemExit):
        overhead.main(["--ablate", "memory"])  # needs --interleave
    with pytest.raises(SystemExit):
        overhead.main(["--interleave", "--ablate", "nothing", "--steps", "40"])


def test_the_garbage_collections_of_each_state():
    runs = [{"on": [False, True, False, True, False], "gc": [0, 1, 0, 0, 0], "gc_us": [0, 300.0, 0, 0, 0]}]
    line = overhead.gc_line(runs, 0)
    assert "off 0.000 a step, 0 us a step (mean), largest 0 us" in line
    assert "on 0.500 a step, 150 us a step (mean), largest 300 us" in line
