"""The calibrate stage: one global clock for the whole job, from every event's duration.

`sweep` holds the numba kernels (discover, replay), `reference` the plain-Python sweep the tests hold
them to, `arrays` the input arrays and their checks, `durations` the default durations of the bare graph,
`stage` the CLI (``python -m prism.calibrate --job DIR``), `synthetic` generated graphs for tests and the
benchmark.
"""

from prism.calibrate.arrays import SweepError, SweepGraph
from prism.calibrate.sweep import Schedule, Timeline, discover

__all__ = ["Schedule", "SweepError", "SweepGraph", "Timeline", "discover"]
