"""`prism bench overhead` against a machine whose speed changes between runs (session 13 on the H200: a W=1 run
ran at ~80 or ~100-128 ms a step whatever the variant): every run pinned to the same cores, the variants'
order alternating, each variant's run compared with the baseline run of its round, the median and spread of
those ratios printed, and a warning where the spread is larger than the overhead reported."""

import os

import pytest

from prism.bench import overhead
from prism.bench import overhead_stats as stats
from prism.runtime.launch import cores as core_claims
from prism.runtime.launch import run_files

# session 13 call 5 (docs/results/frameworks/s13-h200/overhead_5rounds/launch.txt): each round's run medians
NONE = [80.629, 100.274, 82.248, 82.341, 124.489]
TRACE = [128.015, 77.968, 89.863, 83.924, 121.329]


def runs(medians):
    return [[m - 1, m, m + 1] for m in medians]  # three iterations a run, the run's median in the middle


def test_default_cores_are_the_affinity_last_and_given_ones_are_checked():
    assert stats.choose_cores({0, 1, 2, 3}, 1) == [3]
    assert stats.choose_cores({0, 1, 2, 3}, 2) == [2, 3]
    assert stats.choose_cores({0, 1}, 4) == [0, 1]  # more ranks than cores: they share them round-robin
    assert stats.choose_cores({0, 5, 9}, 1, [5]) == [5]
    assert stats.choose_cores({0, 1, 2}, 1, [2, 0]) == [2]
    with pytest.raises(ValueError, match=r"core\(s\) \[7\] are not in this process's affinity \[0, 1\]"):
        stats.choose_cores({0, 1}, 1, [7])
    with pytest.raises(ValueError, match="names 1 distinct core"):
        stats.choose_cores({0, 1, 2}, 2, [1, 1])


def test_rounds_alternate_their_order():
    v = ("none", "prismtrace", "profiler")
    assert [stats.round_order(v, r)[0] for r in range(4)] == ["none", "profiler", "none", "profiler"]
    assert stats.round_order(v, 1) == ("profiler", "prismtrace", "none")


def test_paired_ratios_take_each_rounds_own_baseline():
    pair = stats.paired({"none": runs(NONE), "prismtrace": runs(TRACE)})["prismtrace"]
    assert pair.ratios == pytest.approx([t / n for t, n in zip(TRACE, NONE)])
    assert pair.overhead == pytest.approx(83.924 / 82.341 - 1)  # the median round, +1.9 %
    assert pair.spread == pytest.approx(128.015 / 80.629 - 77.968 / 100.274)
    assert stats.level_spread(runs(NONE)) == pytest.approx(124.489 / 80.629 - 1)


def test_a_machine_level_that_hits_every_variant_cancels_in_the_paired_ratio():
    levels = [80, 125, 80, 125, 125]  # the run's speed, whatever the variant
    pair = stats.paired({"none": runs(levels), "x": runs([1.02 * m for m in levels])})["x"]
    assert pair.overhead == pytest.approx(0.02, abs=1e-3)
    assert stats.verdict(pair, stats.level_spread(runs(levels))) is None


def test_a_spread_larger_than_the_overhead_is_warned_and_one_round_always():
    pair = stats.paired({"none": runs(NONE), "prismtrace": runs(TRACE)})["prismtrace"]
    warning = stats.verdict(pair, stats.level_spread(runs(NONE)))
    assert "spread over 81.0 points" in warning and "+1.92 %" in warning and "cannot tell" in warning
    one = stats.paired({"none": runs([80.0]), "prismtrace": runs([90.0])})["prismtrace"]
    assert "one round" in stats.verdict(one, 0.0) and "--repeats 5" in stats.verdict(one, 0.0)


def test_the_bench_pins_every_run_to_the_same_cores_and_prints_the_rounds(monkeypatch, capsys):
    calls = []
    level = iter([80, 82, 110, 125, 126, 150, 80, 81, 100])  # none, prismtrace, profiler; then reversed ...

    def fake_run(variant, work, nproc, workload, steps, wrap=(), cores=()):
        calls.append((variant, list(cores)))
        m = next(level)
        return [m - 1.0, m, m + 1.0], 1000

    monkeypatch.setattr(overhead, "run_variant", fake_run)
    monkeypatch.setattr(overhead, "ranks_cores", lambda work, nproc: [[calls[-1][1][0]]])
    last = max(os.sched_getaffinity(0))
    assert overhead.main(["--nproc", "1", "--steps", "5", "--repeats", "3"]) == 0
    assert {tuple(c) for _, c in calls} == {(last,)}
    assert [v for v, _ in calls] == ["none", "prismtrace", "profiler", "profiler", "prismtrace", "none",
                                     "none", "prismtrace", "profiler"]
    out = capsys.readouterr().out
    assert f"W=1 pinned to core(s) {last} in every run" in out
    assert "variant       median ms   p10 ms   p90 ms  overhead   bytes/iter  bytes vs PrismTrace" in out
    rows = [line.split() for line in out.splitlines() if line[:1] in "123" and "none" in line]
    assert [r[4:7] for r in rows] == [["80.000", "82.000", "110.000"], ["150.000", "126.000", "125.000"],
                                      ["80.000", "81.000", "100.000"]]
    # prismtrace / none per round: +2.5 %, -16.0 %, +1.25 %: median +1.25 %
    assert "prismtrace +1.25% (-16.00 .. +2.50)" in out
    assert "warning: prismtrace: the paired ratios spread over 18.5 points" in out
    assert f"cores the ranks recorded (affinity): [({last},)]" in out and "not comparable" not in out


@pytest.mark.parametrize("value, message", [("x", "not a comma-separated list"),
                                            ("99999", "are not in this process's affinity")])
def test_bad_cores_are_refused_before_any_run(value, message, monkeypatch, capsys):
    monkeypatch.setattr(overhead, "run_variant", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as exc:
        overhead.main(["--nproc", "1", "--cores", value])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_claim_takes_exactly_the_named_cores_and_refuses_a_busy_one(tmp_path, monkeypatch):
    monkeypatch.setattr(run_files, "SHM_ROOT", str(tmp_path))
    monkeypatch.setenv("PRISM_LOCK_WAIT", "0")
    last = max(os.sched_getaffinity(0))
    first = core_claims.CoreClaim(1, "the first run", [last])
    try:
        assert first.cores == [last]  # not the lowest free core
        with pytest.raises(core_claims.CoresBusy, match=f"core {last} held by pid {os.getpid()}: the first run"):
            core_claims.CoreClaim(1, "the second run", [last])
    finally:
        first.release()
    again = core_claims.CoreClaim(1, "the third run", [last])
    assert again.cores == [last]
    again.release()
    with pytest.raises(core_claims.CoresBusy, match="not in this process's affinity"):
        core_claims.CoreClaim(1, "a run", [max(os.sched_getaffinity(0)) + 1000])
