"""The calibrated sweep with some events' durations replaced: what the emulate stage and what-if use.

The emulate stage runs a few sandbox ranks for real; the rest of the job's timeline is computed: the
calibrate sweep with the sandbox's *measured* durations in place of their calibrated ones
(`substitute_measured`, by the rules of `durations.bare_graph` -- ops their issue time, waits what they spend
besides waiting -- but compute and markers by the measured-run rule the calibration takes the slices' by,
`durations.spent_span`: the longer of its wall span and its device time). `lengthen_after_marker` is the
what-if a prediction is compared with: a rank's compute lengthened by a fixed time per microbatch.

`calibrated_inputs` gives the durations and transfers the calibrate stage swept: the slice runs'
tables (``slices/durations.parquet``, ``slices/transfers.parquet``) when the job has them, else the
bare-graph baseline, as `prism.calibrate` does without ``--durations`` / ``--transfers``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_COMPUTE, K_MARKER
from prism.calibrate.sweep import Timeline, discover
from prism.job import SLICES, TIMED_SLICES, JobGraph, id_rank, own_durations, slice_transfers


SLICE_RUNS = "slice runs"  # how `calibrated_inputs` names durations measured by slice runs


def measured_by_slices(source: str) -> bool:
    """Whether `calibrated_inputs`' source is slice runs (their durations by the measured-run rule: compute and
    markers their spent span), not the bare graph (their own device time)."""
    return source.startswith(SLICE_RUNS)


def calibrated_inputs(job_dir: str | Path, job: JobGraph) -> tuple[np.ndarray, np.ndarray, str]:
    """(durations int64[n] in event order, transfers int64[m], where they came from: `measured_by_slices`)."""
    job_dir = Path(job_dir)
    g, c = job.graph, job.columns
    dur, xfer = rules.bare_graph(g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"], c["t_end_ns"],
                                 c["t_complete_ns"], g.n_comms)
    for folder in (TIMED_SLICES, SLICES):  # what calibrated/ is made of: the timed pass when there is one
        d_path, t_path = own_durations(job_dir, folder), slice_transfers(job_dir, folder)
        if d_path.is_file() and t_path.is_file():
            dur = rules.read_durations(d_path, np.sort(job.event_ids))[id_rank(job.event_ids)]
            xfer = rules.read_transfers(t_path, job.comm_ids)
            return dur, xfer, f"{SLICE_RUNS} ({d_path.relative_to(job_dir)}, {t_path.relative_to(job_dir)})"
    return dur, xfer, "bare graph (no slice runs)"


def substitute_measured(
    job: JobGraph,
    durations: np.ndarray,
    rows: np.ndarray,
    device_ns: np.ndarray,
    t_start_ns: np.ndarray,
    t_end_ns: np.ndarray,
    t_complete_ns: np.ndarray,
    cpu_ns: np.ndarray | None = None,
    spent: bool = True,
) -> np.ndarray:
    """`durations` with the events at positions `rows` timed by their measurement (arrays aligned with
    `rows`, on any one clock per row set), by the bare-graph rules, compute and markers by the measured-run
    rule (`durations.spent_span`): the longer of its wall span and its device time, as the calibration took the
    slice runs' (`from_slices`). On CPU the device time is the thread's CPU time, 1.02-1.10x short of the span the
    rank spent (session 19: the emulate stage's "program" ran 2.6 points of the prediction low on the
    host's 33 runs, and its "delay" as much high, by that alone). Returns a new array. `cpu_ns`: the
    waits' own time (`durations.own_ns`); without it, `device_ns` (the same values on CPU). `spent` False: compute
    and markers by their device time too, for a calibration of the bare graph (no slice runs), whose durations
    are so (`calibrated_inputs`, `measured_by_slices`)."""
    g = job.graph
    n = g.n_events
    rows = np.asarray(rows, dtype=np.int64)
    own = device_ns if cpu_ns is None else rules.own_ns(g.kind[rows], device_ns, cpu_ns)
    cols = []
    for values in (own, t_start_ns, t_end_ns, t_complete_ns):
        full = np.full(n, -1, dtype=np.int64)
        full[rows] = np.asarray(values, dtype=np.int64)
        cols.append(full)
    measured, _ = rules.bare_graph(g.kind, g.comm, g.wait_op, *cols, g.n_comms)
    if spent:  # `durations.measured_run`'s compute and markers, as the slice runs' were taken
        measured = rules.spent_span(g.kind, measured, cols[1], cols[2])
    out = np.array(durations, dtype=np.int64, copy=True)
    out[rows] = measured[rows]
    return out


def lengthen_after_marker(job: JobGraph, durations: np.ndarray, rank: int, extra_ns: int,
                          marker: str = "fwd_end") -> np.ndarray:
    """`durations` with `extra_ns` added to the first compute event after each `marker` of `rank` (the
    span a program spends right after each microbatch's forward, for ``marker="fwd_end"``)."""
    g = job.graph
    lo, hi = int(g.rank_ptr[rank]), int(g.rank_ptr[rank + 1])
    names = np.array(g.op_names + [""], dtype=object)
    is_marker = (g.kind[lo:hi] == K_MARKER) & (names[g.op_code[lo:hi]] == marker)
    compute = np.flatnonzero(g.kind[lo:hi] == K_COMPUTE)
    out = np.array(durations, dtype=np.int64, copy=True)
    for m in np.flatnonzero(is_marker):
        nxt = compute[np.searchsorted(compute, m)] if np.searchsorted(compute, m) < len(compute) else -1
        if nxt >= 0:
            out[lo + nxt] += int(extra_ns)
    return out


def sweep(job: JobGraph, durations: np.ndarray, transfers: np.ndarray) -> Timeline:
    """The global timeline for these durations (the calibrate sweep)."""
    return discover(job.graph, durations, transfers)[1]


__all__ = ["calibrated_inputs", "lengthen_after_marker", "measured_by_slices", "substitute_measured", "sweep"]
