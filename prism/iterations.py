"""The job's iteration time: the one definition used by `prism calibrate`, the summary and the fidelity bench.

Iteration k of the job ends when its last rank ends iteration k (a rank's iteration ends with its
``iteration_end`` marker; in a calibrated timeline, ``calibrated/iterations.parquet``'s ``end_ns``).
The job's iteration times are the gaps between consecutive ends, end(k) - end(k-1) for k >= 1:
iteration 0 (start-up, warm-up) has no gap and is left out. The statistic reported is their median
(min and max beside it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class IterationTimes:
    """The job's iteration times (ns), iterations 1..n, in iteration order."""

    gaps_ns: np.ndarray

    @property
    def median_ns(self) -> float:
        return float(np.median(self.gaps_ns))

    @property
    def median_ms(self) -> float:
        return self.median_ns / 1e6

    @property
    def min_ns(self) -> int:
        return int(self.gaps_ns.min())

    @property
    def max_ns(self) -> int:
        return int(self.gaps_ns.max())

    def __len__(self) -> int:
        return len(self.gaps_ns)


def job_iteration_ends(iteration, end_ns) -> np.ndarray:
    """The job's iteration ends (the latest end over ranks of each iteration number), in iteration order.

    `iteration` and `end_ns` are parallel sequences, one entry per rank and iteration."""
    iteration = np.asarray(iteration, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    if iteration.shape != end_ns.shape:
        raise ValueError(f"iteration ({iteration.shape}) and end_ns ({end_ns.shape}) differ in length")
    if not len(iteration):
        return np.zeros(0, dtype=np.int64)
    keys, inverse = np.unique(iteration, return_inverse=True)
    ends = np.full(len(keys), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ends, inverse, end_ns)
    return ends


def iteration_times(iteration, end_ns) -> IterationTimes | None:
    """The job's iteration times from per-rank iteration ends; None with fewer than two iterations."""
    ends = job_iteration_ends(iteration, end_ns)
    if len(ends) < 2:
        return None
    return IterationTimes(np.diff(ends))
