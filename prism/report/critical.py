"""The critical path of one iteration of the calibrated timeline (`prism.calibrate.critical_path`), as a table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from prism import job as job_files
from prism.calibrate.critical_path import critical_path
from prism.job import load_graph


def iteration_critical_path(job: str | Path, events: pl.DataFrame, iteration: int) -> pl.DataFrame:
    """The events on the critical path of `iteration` in the calibrated timeline, in time order: the calibrate
    stage's ``calibrated/critical_path.parquet`` when the job has it (what ``calibrated.critical_path`` shows),
    else walked here.

    `events`: the calibrated timeline (`prism.report.data.load_timeline(job, "calibrated").events`). The
    walk starts at the iteration_end marker of `iteration` that ended last and stops before the first event
    that ended by the previous iteration's job end (the iteration's start). Uses the durations
    the calibration used (``slices/durations.parquet``) when present, to tell a blocked wait."""
    job = Path(job)
    written = job_files.calibrated(job, "critical_path")
    if written.is_file():  # the calibrate stage's, walked with the durations it swept (`critical_path_table`)
        path = pl.read_parquet(written, columns=["iteration", "step", "event_id"])
        path = path.filter(pl.col("iteration") == iteration)
        if not path.height:
            raise ValueError(f"{written}: no critical path of iteration {iteration}")
        rows = path.join(events, on="event_id", how="inner").sort("step")
        if rows.height != path.height:
            raise ValueError(f"{written}: its event ids are not the calibrated timeline's; re-run prism calibrate")
        return rows.select("event_id", "rank", "seq", "kind", "op", "group_name", "stream", "start_ns", "end_ns")
    graph = load_graph(job)
    ordered = events.sort("rank", "seq")
    if not np.array_equal(ordered["event_id"].to_numpy(), graph.event_ids):
        raise ValueError(f"{job}: the calibrated timeline's events are not the graph's; re-run prism calibrate")
    start = ordered["start_ns"].to_numpy().astype(np.int64)
    end = ordered["end_ns"].to_numpy().astype(np.int64)
    ends = np.flatnonzero(graph.iteration_end & (graph.iteration == iteration))
    if not len(ends):
        raise ValueError(f"{job}: no iteration_end marker of iteration {iteration}")
    last = int(ends[np.argmax(end[ends])])
    before = np.flatnonzero(graph.iteration_end & (graph.iteration == iteration - 1))
    stop = int(end[before].max()) if len(before) else None
    durations = None
    own = job_files.own_durations(job)
    if own.is_file():
        table = pl.read_parquet(own, columns=["event_id", "duration_ns"])
        joined = ordered.select("event_id").join(table, on="event_id", how="left", maintain_order="left")
        if joined["duration_ns"].null_count() == 0:  # else: durations of another graph, not used
            durations = joined["duration_ns"].to_numpy().astype(np.int64)
    path = critical_path(graph.graph, start, end, last, stop_ns=stop, durations=durations)
    return ordered[path.tolist()].select("event_id", "rank", "seq", "kind", "op", "group_name", "stream", "start_ns",
                                          "end_ns")


__all__ = ["iteration_critical_path"]
