"""A job's timelines as one table shape, and the figures the report shows, computed from the artifacts.

Every timeline (`TIMELINES`) is read into the same columns: the graph's event columns (event_id, rank,
seq, kind, op, group_name, stream, iteration, comm_id, op_event_id, bytes, mem_peak_bytes) and ``start_ns``,
``end_ns`` on one clock, ns from the timeline's first event:

- ``capture``: the context-switching capture (``graph/events.parquet``, host clock; ranks took turns on
  the device slots, so these times are not the job's);
- ``calibrated``: the prediction (``graph/events.parquet`` + ``calibrated/timeline.parquet``);
- ``baseline``: the real run (``baseline/graph/events.parquet``);
- ``emulation``: ``emulation/events.parquet`` (graph event columns, ``start_ns``, ``end_ns``, ``source``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from prism import job as job_files
from prism.artifacts import ArtifactError
from prism.iterations import iteration_times

TIMELINES = ("capture", "calibrated", "baseline", "emulation")
EVENT_COLUMNS = ["event_id", "rank", "seq", "kind", "op", "group_name", "stream", "iteration", "comm_id",
                 "op_event_id", "bytes", "mem_peak_bytes"]
COMM_KINDS = ("collective", "send", "recv", "wait")


class ReportError(ArtifactError):
    """An input of the report or an export is missing; the message names the file and the stage to run."""


@dataclass(eq=False)
class Timeline:
    """One timeline of a job: events (see the module docstring) and the comms that bind them."""

    name: str
    events: pl.DataFrame  # sorted by rank, seq
    comms: pl.DataFrame  # comm_id, kind (collective | p2p), op, event_ids

    @property
    def world(self) -> int:
        return int(self.events["rank"].max()) + 1 if self.events.height else 0


def _read(path: Path, stage: str, columns: list[str] | None = None) -> pl.DataFrame:
    if not path.is_file():
        raise ReportError(f"{path} is missing: run {stage} first")
    frame = pl.read_parquet(path, columns=columns)
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String)) if frame.width else frame


def _graph_events(folder: Path, stage: str) -> pl.DataFrame:
    return _read(job_files.graph_table(folder, "events"), stage, EVENT_COLUMNS + ["t_start_ns", "t_end_ns"])


def _comms(folder: Path, stage: str) -> pl.DataFrame:
    return _read(job_files.graph_table(folder, "comms"), stage, ["comm_id", "kind", "op", "event_ids"])


def _from_host_clock(events: pl.DataFrame) -> pl.DataFrame:
    t0 = events["t_start_ns"].min() if events.height else 0
    return events.with_columns(start_ns=pl.col("t_start_ns") - t0, end_ns=pl.col("t_end_ns") - t0)


def load_timeline(job: str | Path, name: str) -> Timeline:
    """Timeline `name` (one of `TIMELINES`) of the job at `job`; `ReportError` when it is not there."""
    job = Path(job)
    if name not in TIMELINES:
        raise ReportError(f"unknown timeline {name!r}: choose one of {', '.join(TIMELINES)}")
    graph_stage = f"the graph stage (prism graph --job {job})"
    if name == "capture":
        events = _from_host_clock(_graph_events(job_files.graph_dir(job), graph_stage))
        comms = _comms(job_files.graph_dir(job), graph_stage)
    elif name == "baseline":
        stage = f"the baseline (prism baseline, then prism graph --job {job_files.baseline(job)})"
        events = _from_host_clock(_graph_events(job_files.graph_dir(job_files.baseline(job)), stage))
        comms = _comms(job_files.graph_dir(job_files.baseline(job)), stage)
    elif name == "calibrated":
        events = _graph_events(job_files.graph_dir(job), graph_stage)
        times = _read(job_files.calibrated(job, "timeline"), f"the calibrate stage (prism calibrate --job {job})",
                      ["event_id", "start_ns", "end_ns"])
        events = events.join(times, on="event_id", how="inner")
        if events.height != times.height:
            raise ReportError(f"{job_files.calibrated(job)}: its event ids are not the graph's: "
                              f"re-run prism calibrate --job {job}")
        comms = _comms(job_files.graph_dir(job), graph_stage)
    else:
        path = job_files.emulation(job, "events.parquet")
        events = _read(path, "the emulation stage (snakemake with an `emulate` section in the config)")
        missing = [c for c in ("event_id", "rank", "seq", "kind", "op", "start_ns", "end_ns") if c not in events.columns]
        if missing:
            raise ReportError(f"{path}: lacks columns {missing}; re-run the emulation stage with this prism")
        for column, default in (("stream", 0), ("comm_id", -1), ("op_event_id", -1), ("bytes", 0),
                                ("mem_peak_bytes", -1), ("group_name", None), ("iteration", 0)):
            if column not in events.columns:
                events = events.with_columns(pl.lit(default).alias(column))
        comms = _comms(job_files.graph_dir(job), graph_stage)
    keep = EVENT_COLUMNS + ["start_ns", "end_ns"] + (["source"] if "source" in events.columns else [])
    events = events.select(keep).sort("rank", "seq")
    return Timeline(name, events, comms)


# --------------------------------------------------------------------------------------------- figures


def job_iteration_time(iterations: pl.DataFrame) -> dict | None:
    """median/min/max of the job's iteration time (ms, `prism.iterations`) from per-rank iteration ends."""
    times = iteration_times(iterations["iteration"].to_numpy(), iterations["end_ns"].to_numpy())
    if times is None:
        return None
    return {"median_ms": times.median_ms, "min_ms": times.min_ns / 1e6, "max_ms": times.max_ns / 1e6,
            "n": len(times), "gaps_ms": (times.gaps_ns / 1e6).tolist()}


def marker_iterations(events: pl.DataFrame) -> pl.DataFrame:
    """rank, iteration, end_ns, duration_ns from the iteration_end markers of a measured timeline (iteration k
    of a rank: from its previous marker's end, as `prism.job.iterations_table` does)."""
    ends = (events.filter((pl.col("kind") == "marker") & (pl.col("op") == "iteration_end"))
            .select("rank", "iteration", "end_ns").sort("rank", "iteration"))
    return ends.with_columns(duration_ns=pl.col("end_ns") - pl.col("end_ns").shift(1).over("rank"))


def per_rank_iteration(iterations: pl.DataFrame) -> pl.DataFrame:
    """rank, median_ms of the rank's iteration time over iterations >= 1."""
    return (iterations.filter((pl.col("iteration") >= 1) & pl.col("duration_ns").is_not_null())
            .group_by("rank").agg(median_ms=pl.col("duration_ns").median() / 1e6).sort("rank"))


def time_breakdown(events: pl.DataFrame, own_ns: pl.DataFrame | None) -> pl.DataFrame:
    """Per rank, over iterations >= 1 (all, when there is only one): compute, communication and idle ms.

    compute: compute events; communication: collective, send, recv and wait events; idle: the part of a
    wait beyond its own duration (`own_ns`: event_id, duration_ns, the durations the calibration used),
    the time the rank was blocked on others. Without `own_ns`, idle is not separated (0)."""
    later = events.filter(pl.col("iteration") >= 1)
    ev = (later if later.height else events).with_columns(span=pl.col("end_ns") - pl.col("start_ns"))
    if own_ns is not None:
        ev = ev.join(own_ns.select("event_id", own="duration_ns"), on="event_id", how="left")
        blocked = pl.when(pl.col("kind") == "wait").then((pl.col("span") - pl.col("own")).clip(lower_bound=0)) \
            .otherwise(0).fill_null(0)
    else:
        blocked = pl.lit(0)
    ev = ev.with_columns(idle=blocked)
    return (ev.group_by("rank").agg(
        compute_ms=pl.col("span").filter(pl.col("kind") == "compute").sum() / 1e6,
        communication_ms=(pl.col("span") - pl.col("idle")).filter(pl.col("kind").is_in(COMM_KINDS)).sum() / 1e6,
        idle_ms=pl.col("idle").sum() / 1e6,
    ).sort("rank"))


def iteration_shares(breakdown: pl.DataFrame, iterations: pl.DataFrame) -> pl.DataFrame:
    """Per rank: its iterations (n), mean iteration_ms, and compute, communication, idle and other (time between
    events: markers, gaps) as ms an iteration and % of the iteration. From `time_breakdown` (sums over iterations
    >= 1) and the rank's iteration times over the same iterations (all of them when there is only one)."""
    later = iterations.filter((pl.col("iteration") >= 1) & pl.col("duration_ns").is_not_null())
    rows = later if later.height else iterations.filter(pl.col("duration_ns").is_not_null())
    per = rows.group_by("rank").agg(n=pl.len(), total_ms=pl.col("duration_ns").sum() / 1e6)
    out = breakdown.join(per, on="rank", how="inner").with_columns(
        other_ms=(pl.col("total_ms") - pl.col("compute_ms") - pl.col("communication_ms") - pl.col("idle_ms"))
        .clip(lower_bound=0))
    parts = ("compute", "communication", "idle", "other")
    return out.select(
        "rank", "n", iteration_ms=pl.col("total_ms") / pl.col("n"),
        **{f"{k}_ms": pl.col(f"{k}_ms") / pl.col("n") for k in parts},
        **{f"{k}_pct": 100 * pl.col(f"{k}_ms") / pl.col("total_ms") for k in parts},
    ).sort("rank")


def shares_by_class(shares: pl.DataFrame, classes: pl.DataFrame) -> pl.DataFrame:
    """`iteration_shares` averaged over the ranks of each class (`occupancy.rank_classes`), with the class's size."""
    value = [c for c in shares.columns if c.endswith(("_ms", "_pct"))]
    return (shares.join(classes, on="rank", how="left").group_by("class")
            .agg(ranks=pl.len(), **{c: pl.col(c).mean() for c in value})
            .sort(pl.col("class").str.extract(r"(-?\d+)$").cast(pl.Int64, strict=False), "class"))  # stage 2 < 10


def peak_memory(events: pl.DataFrame) -> pl.DataFrame:
    """rank, peak_mib (the largest mem_peak_bytes the rank recorded; null where not measured)."""
    return (events.group_by("rank").agg(peak=pl.col("mem_peak_bytes").max())
            .with_columns(peak_mib=pl.when(pl.col("peak") >= 0).then(pl.col("peak") / 2**20))
            .select("rank", "peak_mib").sort("rank"))


def one_iteration(events: pl.DataFrame, iterations: pl.DataFrame, iteration: int) -> pl.DataFrame:
    """The events of every rank inside the job's `iteration` (from the earliest start to the latest end of
    that iteration over ranks): what the Gantt chart shows."""
    it = iterations.filter(pl.col("iteration") == iteration)
    lo = int(it["start_ns"].min()) if "start_ns" in it.columns else int(it["end_ns"].min())
    hi = int(it["end_ns"].max())
    return events.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))


def shown_iteration(iterations: pl.DataFrame) -> int:
    """The iteration the report draws: the job's median iteration (iterations >= 1), else the last."""
    its = sorted(set(iterations["iteration"].to_list()))
    times = job_iteration_time(iterations)
    if times is None:
        return its[-1]
    gaps = np.asarray(times["gaps_ms"])
    return int(its[1 + int(np.argsort(gaps)[len(gaps) // 2])])


__all__ = ["ReportError", "TIMELINES", "Timeline", "iteration_shares", "job_iteration_time", "load_timeline",
           "marker_iterations", "one_iteration", "peak_memory", "per_rank_iteration", "shares_by_class",
           "shown_iteration", "time_breakdown"]
