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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism.artifacts import ArtifactError, is_prism_artifact, read_parquet, same_run, write_outputs
from prism.calibrate import durations as dur_rules
from prism.calibrate.arrays import K_MARKER, KINDS, SweepError, SweepGraph
from prism.calibrate.critical_path import critical_path, last_arrivals
from prism.calibrate.sweep import Schedule, Timeline, discover
from prism.iterations import iteration_times

EVENT_COLUMNS = ["event_id", "rank", "seq", "kind", "op", "group", "iteration", "comm_id", "op_event_id",
                 "t_start_ns", "t_end_ns", "device_ns", "cpu_ns", "t_complete_ns"]
COMM_COLUMNS = ["comm_id", "kind", "n_members", "event_ids"]


class CalibrateError(ArtifactError):
    """The stage's input is missing or inconsistent; the message names the file and the event."""


@dataclass(eq=False)
class JobGraph:
    """A job's graph tables as sweep arrays, with what the outputs and messages need."""

    graph: SweepGraph
    event_ids: np.ndarray  # int64[n], sorted: the graph's event_id of every event position
    rank: np.ndarray  # int32[n]
    seq: np.ndarray  # int64[n]
    iteration: np.ndarray  # int32[n]
    iteration_end: np.ndarray  # bool[n]: an iteration_end marker
    comm_ids: np.ndarray  # int64[m], sorted
    # device_ns, cpu_ns, t_start_ns, t_end_ns, t_complete_ns (event positions), and own_ns: each event's own
    # time on the clock the duration rules take (`durations.own_ns`: waits cpu_ns, other events device_ns)
    columns: dict[str, np.ndarray]


# ----------------------------------------------------------------------------------------------- input


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """(int32 codes, names) of a string or dictionary column; nulls get -1."""
    encoded = pc.dictionary_encode(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    return indices, [str(v) for v in encoded.dictionary.to_pylist()]


def _ints(table: pa.Table, name: str, path: Path) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise CalibrateError(f"{path}: column {name!r} has nulls")
    return column.to_numpy().astype(np.int64)


def _read(path: Path, columns: list[str], job: Path) -> pa.Table:
    if not path.is_file():
        raise CalibrateError(f"{path}: missing; build the graph first (`prism graph --job {job}`)")
    table = read_parquet(path)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise CalibrateError(f"{path}: lacks columns {missing}; rebuild it with this prism (`prism graph`)")
    return table.select(columns)


def load_graph(job: str | Path) -> JobGraph:
    """The graph of ``JOB/graph`` as sweep arrays; `CalibrateError` names the file and event at fault."""
    job = Path(job)
    ev_path, comm_path = job / "graph" / "events.parquet", job / "graph" / "comms.parquet"
    events = _read(ev_path, EVENT_COLUMNS, job)
    comms = _read(comm_path, COMM_COLUMNS, job)

    rank = _ints(events, "rank", ev_path)
    seq = _ints(events, "seq", ev_path)
    order = np.lexsort((seq, rank))
    if np.any(order != np.arange(len(order))):
        events = events.take(pa.array(order))
        rank, seq = rank[order], seq[order]
    n = len(rank)
    if n and rank[0] < 0:
        raise CalibrateError(f"{ev_path}: negative rank {int(rank[0])}")
    world = int(rank[-1]) + 1 if n else 0
    rank_ptr = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(np.bincount(rank, minlength=world), out=rank_ptr[1:])
    expected = np.arange(n) - np.repeat(rank_ptr[:-1], np.diff(rank_ptr))
    bad = np.flatnonzero(seq != expected)
    if len(bad):
        i = int(bad[0])
        raise CalibrateError(
            f"{ev_path}: rank {int(rank[i])} has seq {int(seq[i])} where {int(expected[i])} was expected; "
            "a rank's events must be numbered 0, 1, 2, ... (rebuild the graph with `prism graph`)"
        )

    event_ids = _ints(events, "event_id", ev_path)
    id_order = np.argsort(event_ids, kind="stable")
    sorted_ids = event_ids[id_order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(dup):
        raise CalibrateError(f"{ev_path}: event_id {int(sorted_ids[dup[0]])} appears twice")
    identity = bool(np.all(event_ids == np.arange(n)))

    def position(ids: np.ndarray) -> np.ndarray:
        """Event positions of event ids (-1 where not an event id)."""
        if identity:
            return np.where((ids >= 0) & (ids < n), ids, -1)
        at = np.minimum(np.searchsorted(sorted_ids, ids), max(n - 1, 0))
        found = (n > 0) & (sorted_ids[at] == ids) if n else np.zeros(len(ids), dtype=bool)
        return np.where(found, id_order[at], -1)

    kind_codes, kind_names = _codes(events.column("kind"))
    mapping = np.array([KINDS.index(k) if k in KINDS else -1 for k in kind_names] + [-1], dtype=np.int8)
    kind = mapping[kind_codes]
    bad = np.flatnonzero(kind < 0)
    if len(bad):
        i = int(bad[0])
        name = kind_names[kind_codes[i]] if kind_codes[i] >= 0 else None
        raise CalibrateError(
            f"{ev_path}: rank {int(rank[i])} seq {int(seq[i])} has kind {name!r}, not one of {KINDS}"
        )
    op_code, op_names = _codes(events.column("op"))
    group_code, group_names = _codes(events.column("group"))
    group_names = _with_descs(group_names, job / "graph" / "groups.parquet")

    comm_ids = _ints(comms, "comm_id", comm_path)
    c_order = np.argsort(comm_ids, kind="stable")
    comms = comms.take(pa.array(c_order))
    comm_ids = comm_ids[c_order]
    dup = np.flatnonzero(comm_ids[1:] == comm_ids[:-1])
    if len(dup):
        raise CalibrateError(f"{comm_path}: comm_id {int(comm_ids[dup[0]])} appears twice")
    m = len(comm_ids)

    graph = SweepGraph(
        rank_ptr=rank_ptr, kind=kind, comm=np.full(n, -1, dtype=np.int64), wait_op=np.full(n, -1, dtype=np.int64),
        comm_p2p=np.asarray(pc.equal(comms.column("kind").cast(pa.string()), "p2p").to_numpy(zero_copy_only=False),
                            dtype=bool),
        op_code=op_code, op_names=op_names, group_code=group_code, group_names=group_names, comm_ids=comm_ids,
    )
    raw_comm = _ints(events, "comm_id", ev_path)
    has = np.flatnonzero(raw_comm >= 0)
    at = np.minimum(np.searchsorted(comm_ids, raw_comm[has]), max(m - 1, 0))
    found = (comm_ids[at] == raw_comm[has]) if m else np.zeros(len(has), dtype=bool)
    if not found.all():
        i = int(has[np.flatnonzero(~found)[0]])
        raise CalibrateError(
            f"{ev_path}: {graph.describe(i)}: comm_id {int(raw_comm[i])} is not in {comm_path.name} "
            "(an unmatched comm); rebuild the graph (`prism graph`)"
        )
    graph.comm[has] = at

    raw_op = _ints(events, "op_event_id", ev_path)
    has = np.flatnonzero(raw_op >= 0)
    pos = position(raw_op[has])
    if np.any(pos < 0):
        i = int(has[np.flatnonzero(pos < 0)[0]])
        raise CalibrateError(f"{ev_path}: {graph.describe(i)}: op_event_id {int(raw_op[i])} is not an event")
    graph.wait_op[has] = pos

    _check_members(graph, comms, position, comm_path)
    columns = {name: _ints(events, name, ev_path)
               for name in ("device_ns", "cpu_ns", "t_start_ns", "t_end_ns", "t_complete_ns")}
    columns["own_ns"] = dur_rules.own_ns(kind, columns["device_ns"], columns["cpu_ns"])
    ends = (kind == K_MARKER) & (np.array(op_names + [""], dtype=object)[op_code] == "iteration_end")
    return JobGraph(
        graph, event_ids, rank.astype(np.int32), seq, _ints(events, "iteration", ev_path).astype(np.int32),
        ends.astype(bool), comm_ids, columns,
    )


def _with_descs(names: list[str], path: Path) -> list[str]:
    """Group names with the program's description where groups.parquet has one: '13 (tp)'."""
    if not path.is_file():
        return names
    try:
        groups = read_parquet(path).select(["group", "desc"]).to_pylist()
    except (ArtifactError, KeyError, pa.ArrowInvalid):
        return names
    descs = {g["group"]: g["desc"] for g in groups if g["desc"] and g["desc"] != g["group"]}
    return [f"{n} ({descs[n]})" if n in descs else n for n in names]


def _check_members(graph: SweepGraph, comms: pa.Table, position, path: Path) -> None:
    """Every comm's ``event_ids`` are exactly the events whose ``comm_id`` is that comm."""
    lists = comms.column("event_ids").combine_chunks()
    counts = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    listed = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    pos = position(listed)
    bad = np.flatnonzero(pos < 0)
    if len(bad):
        i = int(bad[0])
        raise CalibrateError(f"{path}: comm {graph.comm_name(int(owner[i]))} lists event_id {int(listed[i])}, "
                             "which is not in events.parquet")
    bad = np.flatnonzero(graph.comm[pos] != owner)
    if len(bad):
        i = int(bad[0])
        raise CalibrateError(
            f"{path}: comm {graph.comm_name(int(owner[i]))} lists {graph.describe(int(pos[i]))}, whose comm_id is "
            f"{int(graph.comm_ids[graph.comm[pos[i]]]) if graph.comm[pos[i]] >= 0 else -1}; rebuild the graph"
        )
    n_members = comms.column("n_members").to_numpy().astype(np.int64)
    referencing = np.bincount(graph.comm[graph.comm >= 0], minlength=len(counts))
    bad = np.flatnonzero((referencing != counts) | (n_members != counts))
    if len(bad):
        c = int(bad[0])
        raise CalibrateError(
            f"{path}: comm {graph.comm_name(c)} has n_members {int(n_members[c])} and {int(counts[c])} event_ids, "
            f"but {int(referencing[c])} events take part in it: an unmatched comm; rebuild the graph"
        )


# ---------------------------------------------------------------------------------------------- output


def timeline_table(job: JobGraph, timeline: Timeline) -> pa.Table:
    return pa.table({
        "rank": job.rank,
        "seq": job.seq,
        "event_id": job.event_ids,
        "start_ns": timeline.start_ns,
        "end_ns": timeline.end_ns,
    })


def iterations_table(job: JobGraph, timeline: Timeline) -> pa.Table:
    """Per rank and iteration: start, end, duration (see the module docstring)."""
    ptr = job.graph.rank_ptr
    ends = np.flatnonzero(job.iteration_end)
    end_rank = job.rank[ends].astype(np.int64)
    start = np.empty(len(ends), dtype=np.int64)
    if len(ends):
        first = np.r_[True, end_rank[1:] != end_rank[:-1]]  # a rank's first marker
        start[first] = timeline.start_ns[ptr[end_rank[first]]]
        start[~first] = timeline.end_ns[ends[:-1][~first[1:]]]  # the previous marker's end
    rows = {
        "rank": end_rank,
        "iteration": job.iteration[ends].astype(np.int64),
        "start_ns": start,
        "end_ns": timeline.end_ns[ends],
    }
    # ranks without markers: one row per run of equal `iteration` (it never decreases along a rank)
    bare = np.setdiff1d(np.flatnonzero(np.diff(ptr) > 0), np.unique(end_rank))
    if len(bare):
        sel = np.isin(job.rank, bare)
        idx = np.flatnonzero(sel)
        key = job.rank[idx].astype(np.int64) * (1 << 32) + job.iteration[idx].astype(np.int64)
        cut = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        last = np.r_[cut[1:], len(idx)] - 1
        rows = {
            "rank": np.r_[rows["rank"], job.rank[idx[cut]]],
            "iteration": np.r_[rows["iteration"], job.iteration[idx[cut]]],
            "start_ns": np.r_[rows["start_ns"], timeline.start_ns[idx[cut]]],
            "end_ns": np.r_[rows["end_ns"], timeline.end_ns[idx[last]]],
        }
        order = np.lexsort((rows["iteration"], rows["rank"]))
        rows = {k: v[order] for k, v in rows.items()}
    rows["duration_ns"] = rows["end_ns"] - rows["start_ns"]
    return pa.table({
        "rank": rows["rank"].astype(np.int32),
        "iteration": rows["iteration"].astype(np.int32),
        "start_ns": rows["start_ns"].astype(np.int64),
        "end_ns": rows["end_ns"].astype(np.int64),
        "duration_ns": rows["duration_ns"].astype(np.int64),
    })


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
        dur = dur_rules.read_durations(durations, np.sort(job.event_ids))[_id_rank(job.event_ids)]
    if transfers is not None:
        xfer = dur_rules.read_transfers(transfers, job.comm_ids)
    try:
        schedule, timeline = discover(g, dur, xfer)
    except SweepError as exc:
        raise CalibrateError(f"{job_dir / 'graph' / 'events.parquet'}: {exc}") from exc
    tables = {"timeline": timeline_table(job, timeline), "iterations": iterations_table(job, timeline),
              "critical_path": critical_path_table(job, timeline, dur)}
    return tables, schedule, job


def _id_rank(event_ids: np.ndarray) -> np.ndarray:
    """For each event position, its index among the sorted event ids."""
    out = np.empty(len(event_ids), dtype=np.int64)
    out[np.argsort(event_ids, kind="stable")] = np.arange(len(event_ids))
    return out


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>) holding graph/")
    parser.add_argument("--durations", type=Path,
                        help="Parquet table event_id, duration_ns (default: the bare-graph baseline)")
    parser.add_argument("--transfers", type=Path,
                        help="Parquet table comm_id, transfer_ns (default: the bare-graph baseline)")
    parser.add_argument("--out", type=Path, help="output folder (default: JOB/calibrated)")
    args = parser.parse_args(argv)
    out = args.out or args.job / "calibrated"
    began = time.perf_counter()
    try:
        graph = [args.job / "graph" / "events.parquet", args.job / "graph" / "comms.parquet"]
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
