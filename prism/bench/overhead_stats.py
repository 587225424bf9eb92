"""The statistics of `prism bench overhead` that hold against a machine whose speed changes between runs.

On the H200 host (session 13) a W=1 run of the reference workload ran at ~80 or ~100-128 ms a step whatever
the variant, and the level changed between runs and within them, so a median over all rounds' iterations
measures which runs happened to be slow. What holds instead: every run on the same cores (`choose_cores`),
each variant's run compared with the baseline's run of the same round (`paired`: adjacent in time), the
median of those ratios with their spread over rounds, and a warning when that spread is larger than the
overhead (`verdict`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def choose_cores(affinity: set[int] | list[int], nproc: int, given: list[int] | None = None) -> list[int]:
    """The cores every run's ranks are pinned to, in rank order: `given` (checked against `affinity`), else
    the last `nproc` of the affinity (away from core 0, where a Linux host usually serves its interrupts and
    housekeeping); as many as ranks, at most the affinity's count (ranks share them round-robin beyond)."""
    allowed = sorted(affinity)
    count = min(nproc, len(allowed))
    if given:
        outside = [c for c in given if c not in allowed]
        if outside:
            raise ValueError(f"--cores {','.join(map(str, given))}: core(s) {outside} are not in this process's "
                             f"affinity {allowed}; name cores from it (or drop --cores)")
        if len(set(given)) < count:
            raise ValueError(f"--cores {','.join(map(str, given))} names {len(set(given))} distinct core(s) for "
                             f"{count} pinned rank(s): name {count}")
        return list(dict.fromkeys(given))[:count]
    return allowed[-count:]


def round_order(variants: tuple[str, ...], rep: int) -> tuple[str, ...]:
    """The variants' order in round `rep`: forwards, then backwards (A B C, C B A, ...), so that a drift of
    the machine's speed over the call does not always favour the variant run first."""
    return variants if rep % 2 == 0 else tuple(reversed(variants))


@dataclass
class Paired:
    """One variant against the baseline, round by round: `ratios[r]` = its run's median / the baseline run's
    median of round r."""
    variant: str
    ratios: list[float]

    @property
    def overhead(self) -> float:
        """The median over rounds of the paired ratio, minus 1 (a fraction)."""
        return statistics.median(self.ratios) - 1

    @property
    def spread(self) -> float:
        """Max minus min of the paired ratios over rounds (a fraction; 0 with one round)."""
        return max(self.ratios) - min(self.ratios)


def run_medians(per_run: list[list[float]]) -> list[float]:
    """Each run's median iteration time (the run's level, printed so that a slow run shows)."""
    return [statistics.median(d) for d in per_run]


def paired(per_run: dict[str, list[list[float]]], base: str = "none") -> dict[str, Paired]:
    """Each non-baseline variant's per-round ratio to the baseline's run of the same round."""
    ref = run_medians(per_run[base])
    return {v: Paired(v, [m / b for m, b in zip(run_medians(runs), ref)])
            for v, runs in per_run.items() if v != base}


def level_spread(per_run: list[list[float]]) -> float:
    """How far the baseline's run medians lie apart over rounds: max / min - 1 (a fraction)."""
    meds = run_medians(per_run)
    return max(meds) / min(meds) - 1


def verdict(pair: Paired, base_spread: float) -> str | None:
    """A warning when the rounds cannot show this variant's overhead: one round (no spread known), or the paired
    ratios spread over more than the overhead they report. None when the overhead stands clear of the spread."""
    if len(pair.ratios) < 2:
        return (f"{pair.variant}: one round: the run-to-run spread is unknown, so the overhead may be the "
                f"machine's speed between two runs; give --repeats 5 or more")
    if pair.spread > abs(pair.overhead):
        return (f"{pair.variant}: the paired ratios spread over {100 * pair.spread:.1f} points across rounds "
                f"(baseline runs {100 * base_spread:.1f} % apart), more than the {100 * pair.overhead:+.2f} % "
                f"they report: this call cannot tell that overhead from the machine's run-to-run speed")
    return None


# -- PrismTrace on and off in one process (`prism bench overhead --interleave`) ----------------------------------
# Session 15 on the H200: the host's speed level moved within runs too (~80 or ~100-130 ms a step, changing every
# several steps), so no comparison of two processes resolved 3 % of a launch-bound step. In one process with
# PrismTrace switched on and off by blocks of steps, each on block is compared with the off blocks either side
# of it: a level that holds over three blocks cancels in the ratio.


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of `values`: the order statistics x_(k) and
    x_(n+1-k) (1-based) with the largest k for which the interval's coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at
    least `confidence`. Returns (low, high, that coverage); (-inf, inf, 1.0) when n is too small for any k
    (n < 6 at 95 %)."""
    x = sorted(values)
    n = len(x)
    tail, k, below = 0.0, 0, 0.0  # below: P(B < k)
    for j in range(n // 2 + 1):  # P(B <= j) with B ~ Bin(n, 1/2)
        tail += math.comb(n, j) / 2.0 ** n
        if 1 - 2 * tail < confidence:
            break
        k, below = j + 1, tail
    if k == 0:
        return float("-inf"), float("inf"), 1.0
    return x[k - 1], x[n - k], 1 - 2 * below


@dataclass
class Interleaved:
    """The on blocks against their neighbouring off blocks (each block's value: the median of its steps)."""
    ratios: list[float]  # on block / mean of the off blocks before and after it
    changed: list[bool]  # those two off blocks lie more than `level` apart: the host's level changed there
    on_steps: list[float]  # every step time of the on blocks counted (ms)
    off_steps: list[float]  # ... and of the off blocks
    level: float

    @property
    def overhead(self) -> float:
        return statistics.median(self.ratios) - 1

    def ci(self, confidence: float = 0.95) -> tuple[float, float, float]:
        """The median ratio's interval, as overheads (fractions) and its coverage."""
        lo, hi, cover = median_ci(self.ratios, confidence)
        return lo - 1, hi - 1, cover

    @property
    def steady_overhead(self) -> float | None:
        """The median over the pairs whose level held (None if none did)."""
        kept = [r for r, c in zip(self.ratios, self.changed) if not c]
        return statistics.median(kept) - 1 if kept else None

    @property
    def pooled(self) -> float:
        """The pooled medians' ratio minus 1: every counted on step against every counted off step."""
        return statistics.median(self.on_steps) / statistics.median(self.off_steps) - 1


def interleaved(durations: list[float], on: list, warm: int, level: float = 0.10, which=True) -> Interleaved:
    """Pair the blocks of `durations` (a step's time, ms, in step order; `on[k]`: PrismTrace's state in step k,
    False for off, True for on, or an ablation's name: `--ablate`): the steps from `warm` on, cut into runs of one
    state (a run cut by the warm-up or the end keeps the steps it has); each run of state `which` with an off run
    on either side is one pair."""
    if len(durations) != len(on):
        raise ValueError(f"{len(durations)} step times for {len(on)} states")
    runs: list[tuple[object, list[float]]] = []
    for k in range(warm, len(durations)):
        if not runs or on[k] != runs[-1][0]:
            runs.append((on[k], []))
        runs[-1][1].append(durations[k])
    ratios, changed, on_steps, off_steps = [], [], [], []
    for i in range(1, len(runs) - 1):
        state, steps = runs[i]
        if state != which or runs[i - 1][0] is not False or runs[i + 1][0] is not False:
            continue
        before, after = statistics.median(runs[i - 1][1]), statistics.median(runs[i + 1][1])
        ratios.append(statistics.median(steps) / ((before + after) / 2))
        changed.append(max(before, after) / min(before, after) - 1 > level)
    for state, steps in runs:
        if state is False:
            off_steps.extend(steps)
        elif state == which:
            on_steps.extend(steps)
    return Interleaved(ratios, changed, on_steps, off_steps, level)


def interleave_warnings(result: Interleaved, confidence: float = 0.95) -> list[str]:
    """What the pairs cannot show: too few pairs for an interval, or an interval wider than the overhead it
    reports."""
    if not result.ratios:
        return ["no complete pair (an on block with an off block either side after the warm-up): give more --steps"]
    lo, hi, _ = result.ci(confidence)
    if lo == float("-inf"):
        return [f"{len(result.ratios)} pair(s) are too few for a {100 * confidence:.0f} % interval of the median "
                f"(6 or more at 95 %): give more --steps"]
    if hi - lo > abs(result.overhead):
        return [f"the {100 * confidence:.0f} % interval spans {100 * (hi - lo):.2f} points, more than the "
                f"{100 * result.overhead:+.2f} % it reports: the overhead is not resolved from zero"]
    return []


def goal_verdict(result: Interleaved, goal: float, confidence: float = 0.95) -> str:
    """Whether the interval of the median overhead lies below `goal` (a fraction), above it, or across it."""
    lo, hi, _ = result.ci(confidence) if result.ratios else (float("-inf"), float("inf"), 1.0)
    if lo == float("-inf"):
        return f"goal <= {100 * goal:g} %: undecided (no interval: too few pairs)"
    if hi <= goal:
        return f"goal <= {100 * goal:g} %: met (the interval's upper end is {100 * hi:+.2f} %)"
    if lo > goal:
        return f"goal <= {100 * goal:g} %: missed (the interval's lower end is {100 * lo:+.2f} %)"
    return f"goal <= {100 * goal:g} %: undecided (the interval {100 * lo:+.2f} .. {100 * hi:+.2f} % contains it)"
