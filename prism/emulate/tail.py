"""The emulation's computed rows that follow live ones, swept by the clock rule from the live rows' times.

A rank's computed rows after its last live (sandbox or replay) row, and every row of a rank with no live row,
are what the model says happens next *given what ran live*: the calibrate sweep (`prism.calibrate.sweep`, the
clock rule of `prism.clock_rule`) with the substituted durations and the calibrated transfers, where every
live row, and every row before a rank's last live one, is *pinned* at its time (`prism.calibrate.arrays.Pins`):
kept, and its rank's arrival at its measured start when it is an issue. Shifting the substituted sweep onto
the rank's own live rows alone (`outputs.one_clock`) keeps each rank in order but not the ranks together: on
the tiny job a replayed rank's last wait, computed, ended before the sandbox rank's measured issue of the
same all-reduce (the sweep had the sandbox arrive earlier than it did), a completion before the last
arrival that `prism export` counted as an arrow pointing backwards (``flows_left_out``). Here a computed
wait on a comm ends no earlier than the rule's completion over the members' arrivals as the emulation
has them, measured or computed, so every arrow runs forward.

Rows before a rank's first live row keep `one_clock`'s times (nothing real could move them).
"""

from __future__ import annotations

import numpy as np

from prism.calibrate.arrays import Pins, SweepGraph
from prism.calibrate.sweep import sweep


def sweep_tails(graph: SweepGraph, live: np.ndarray, durations: np.ndarray, transfers: np.ndarray,
                start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`start`/`end` (every event, rank-major) with the rows after each rank's last live row, and every row of
    a rank with none, swept from the live rows (module docstring); the other rows are returned as given.
    Raises `prism.calibrate.arrays.SweepError` on a dependency cycle among the computed rows."""
    n = graph.n_events
    if not n:
        return start, end
    ptr = graph.rank_ptr.astype(np.int64)
    idx = np.arange(n, dtype=np.int64)
    rank_of = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    last_live = np.full(len(ptr) - 1, -1, dtype=np.int64)
    np.maximum.at(last_live, rank_of[live], idx[live])
    pinned = idx <= last_live[rank_of]  # live rows and everything before a rank's last live row
    timeline = sweep(graph, durations, transfers, Pins(pinned, start, end))
    return timeline.start_ns, timeline.end_ns


__all__ = ["sweep_tails"]
