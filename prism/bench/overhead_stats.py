"""The statistics of `prism bench overhead` that hold against a machine whose speed changes between runs.

On the H200 host (session 13) a W=1 run of the reference workload ran at ~80 or ~100-128 ms a step whatever
the variant, and the level changed between runs and within them, so a median over all rounds' iterations
measures which runs happened to be slow. What holds instead: every run on the same cores (`choose_cores`),
each variant's run compared with the baseline's run of the same round (`paired`: adjacent in time), the
median of those ratios with their spread over rounds, and a warning when that spread is larger than the
overhead (`verdict`).
"""

from __future__ import annotations

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
