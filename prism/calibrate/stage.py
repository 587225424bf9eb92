"""The calibrate stage: one global clock for the job's graph.

``prism calibrate --job DIR [--durations FILE] [--transfers FILE]`` reads
``DIR/graph/{events,comms}.parquet``, takes every event's duration (default: the bare-graph baseline of
`prism.calibrate.durations`, until slice runs measure them), sweeps the graph in dependency order and
writes, all or none, ``DIR/calibrated/timeline.parquet`` (every event's start and end on the global
clock, ns from the job's start, every rank starting at 0) and ``DIR/calibrated/iterations.parquet``
(iteration k of a rank spans from the end of its (k-1)-th ``iteration_end`` marker, or the rank's first
event, to the end of its k-th; a rank without markers gets one row per value of ``events.iteration``) and
``DIR/calibrated/critical_path.parquet`` (per iteration, the events on its critical path, `critical_path_table`).

Bad input (missing graph, a dependency cycle, an unmatched comm, a durations table of another graph)
is one message naming the file and the event, exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from prism import folder_lock
from prism import job as job_files
from prism.artifacts import ArtifactError, is_prism_artifact, same_run, write_outputs
from prism.calibrate import durations as dur_rules
from prism.calibrate.arrays import SweepError
from prism.calibrate.critical_path import critical_path, last_arrivals
from prism.calibrate.sweep import Schedule, Timeline, discover
from prism.iterations import iteration_times
# the job's graph and the calibrated tables' shape live in the job facade (`prism.job`); named here too,
# for the modules that import them from the stage (prism/bench/fidelity*.py)
from prism.job import JobError, JobGraph, id_rank, iterations_table, load_graph, timeline_table


class CalibrateError(JobError):
    """The stage's input is inconsistent (a durations table of another graph, a slice that does not fit);
    the message names the file and the event. (A missing or broken graph is the facade's `GraphError`.)"""





def critical_path_table(job: JobGraph, timeline: Timeline, durations: np.ndarray) -> pa.Table:
    """Per iteration, the events on its critical path in time order (`prism.calibrate.critical_path`): walked
    back from the iteration_end marker of that iteration that ended last, through each event's binding
    dependency, stopping before the first event that ended by the previous iteration's job end."""
    parts = []
    arrival = last_arrivals(job.graph, timeline.start_ns)
    marks = np.flatnonzero(job.iteration_end)
    of = job.iteration[marks]
    for k in np.unique(of).tolist():
        ends, before = marks[of == k], marks[of == k - 1]
        stop = int(timeline.end_ns[before].max()) if len(before) else None
        last = int(ends[np.argmax(timeline.end_ns[ends])])
        path = critical_path(job.graph, timeline.start_ns, timeline.end_ns, last, stop_ns=stop, durations=durations,
                             arrival=arrival)
        parts.append((np.full(len(path), k, dtype=np.int32), np.arange(len(path), dtype=np.int32), path))
    it = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
    step = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int32)
    pos = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    return pa.table({"iteration": it, "step": step, "rank": job.rank[pos], "seq": job.seq[pos],
                     "event_id": job.event_ids[pos], "start_ns": timeline.start_ns[pos],
                     "end_ns": timeline.end_ns[pos]})


# ----------------------------------------------------------------------------------------------- stage


def calibrate(
    job_dir: str | Path, durations: str | Path | None = None, transfers: str | Path | None = None
) -> tuple[dict[str, pa.Table], Schedule, JobGraph]:
    """The stage's tables (``timeline``, ``iterations``) for the job at `job_dir`; writes nothing."""
    job_dir = Path(job_dir)
    job = load_graph(job_dir)
    g, c = job.graph, job.columns
    dur, xfer = dur_rules.bare_graph(g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"], c["t_end_ns"],
                                     c["t_complete_ns"], g.n_comms)
    if durations is not None:
        dur = dur_rules.read_durations(durations, np.sort(job.event_ids))[id_rank(job.event_ids)]
    if transfers is not None:
        xfer = dur_rules.read_transfers(transfers, job.comm_ids)
    try:
        schedule, timeline = discover(g, dur, xfer)
    except SweepError as exc:
        raise CalibrateError(f"{job_files.graph_file(job_dir)}: {exc}") from exc
    tables = {"timeline": timeline_table(job, timeline), "iterations": iterations_table(job, timeline),
              "critical_path": critical_path_table(job, timeline, dur)}
    return tables, schedule, job


def _summary(tables: dict[str, pa.Table], schedule: Schedule, seconds: float, out: Path) -> str:
    it = tables["iterations"]
    g = schedule.graph
    text = (f"prism calibrate: {g.n_ranks} ranks, {g.n_events} events, {g.n_comms} comms "
            f"({schedule.n_bundles} bundles, {len(schedule.seg_bundle)} segments, {seconds:.2f} s)")
    times = iteration_times(it.column("iteration").to_numpy(), it.column("end_ns").to_numpy())
    if times is not None:
        ms = times.gaps_ns / 1e6
        shown = ", ".join(f"{t:.2f}" for t in ms[:8]) + (" ..." if len(ms) > 8 else "")
        text += (f"; iteration time (job, iterations 1..{len(times)}; prism/iterations.py) ms: {shown}; "
                 f"median {times.median_ms:.2f}")
    return text + f" -> {out}"


@folder_lock.locks_job("prism calibrate")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>) holding graph/")
    parser.add_argument("--durations", type=Path,
                        help="Parquet table event_id, duration_ns (default: the bare-graph baseline)")
    parser.add_argument("--transfers", type=Path,
                        help="Parquet table comm_id, transfer_ns (default: the bare-graph baseline)")
    parser.add_argument("--out", type=Path, help="output folder (default: JOB/calibrated)")
    args = parser.parse_args(argv)
    out = args.out or job_files.calibrated_dir(args.job)
    began = time.perf_counter()
    try:
        graph = [job_files.graph_file(args.job, "events"), job_files.graph_file(args.job, "comms")]
        given = [p for p in (args.durations, args.transfers) if p is not None and p.is_file() and is_prism_artifact(p)]
        run_id = same_run(graph + given)  # a hand-made durations table (no prism metadata) is taken as it is
        tables, schedule, _ = calibrate(args.job, args.durations, args.transfers)
        write_outputs(out, tables, run_id=run_id)
    except ArtifactError as exc:
        print(f"prism calibrate: error: {exc}", file=sys.stderr)
        return 2
    print(_summary(tables, schedule, time.perf_counter() - began, out))
    return 0


__all__ = ["CalibrateError", "JobGraph", "calibrate", "critical_path_table", "iterations_table", "load_graph", "main", "timeline_table"]
