"""The job facade: where a job's artifacts are, its capture's meta.json read and checked once, its graph.

A job folder (``results/<job>/``, `JOB` below) holds, stage by stage: ``capture/`` (the capture's run folder:
``raw/meta.json``, ``raw/rank=R/``, ``payloads/``; a bare capture folder, ``prism launch --out DIR``, is a run
folder of its own), ``graph/{events,comms,groups,ranks}.parquet``, ``slices/plan.parquet`` and
``slices/slice=K/``, ``calibrated/{timeline,iterations}.parquet`` (or another calibrated folder),
``emulation/``, ``baseline/``, ``report/report.html``. The stages, the report and the benchmarks name
those paths through the functions of `prism.job_paths` (re-exported here; the runtime imports that module
itself, as it may not import this one), read the graph as sweep arrays with `load_graph`, and build the
calibrated tables' shape with `timeline_table` / `iterations_table`.

Errors name the file at fault and the fix (`JobError`, an `ArtifactError`; `GraphTablesError` for the graph).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism import schemas
from prism.artifacts import ArtifactError, read_parquet
from prism.calibrate import durations as dur_rules
from prism.calibrate.arrays import K_MARKER, KINDS, SweepGraph
from prism.calibrate.sweep import Timeline
from prism.job_paths import (  # noqa: F401  (re-exported: the analysis names its paths through prism.job)
    META, table_file, stream_file, meta_file, graph_dir, graph_file, graph_table, CALIBRATED, calibrated_dir,
    calibrated, emulation, baseline, SLICES, TIMED_SLICES, UNTIMED_CALIBRATION, slices_dir, slice_plan, slice_dir,
    slice_file, slice_files, own_durations, slice_transfers, summary, report_dir, report, raw_dir, rank_dir,
    rank_stream, rank_streams, replay_stream, meta_path, raw_meta, capture_dir, payloads_dir, capture_candidates,
)
from prism.runtime import modes


class JobError(ArtifactError):
    """A job's artifact is missing or inconsistent; the message names the file and the fix."""


# -- meta.json ------------------------------------------------------------------------------------------
def read_meta(run: Path) -> dict:
    """A run's raw/meta.json, checked: present, valid JSON, a positive world size."""
    return read_meta_file(meta_path(run))


def read_meta_file(path: Path) -> dict:
    """A meta.json, checked (`read_meta`)."""
    path = Path(path)
    if not path.is_file():
        raise JobError(f"{path}: missing (the run did not finish writing its metadata; run it again)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise JobError(f"{path}: not valid JSON ({exc}); run it again") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int) or meta["world_size"] < 1:
        raise JobError(f"{path}: world_size must be a positive integer, got "
                       f"{meta.get('world_size') if isinstance(meta, dict) else meta!r}")
    version = str(meta.get("schema_version", schemas.SCHEMA_VERSION))
    if version != schemas.SCHEMA_VERSION:
        raise JobError(f"{path}: schema_version {version!r}, this prism reads {schemas.SCHEMA_VERSION!r}; "
                       "re-run the capture with this prism"
                       + ("; or rename its columns in place: python -m prism.schema_upgrade JOB_FOLDER"
                          if version == "1" else ""))
    return meta


def find_capture(job: Path, payloads: bool = True, candidates: list[Path] | None = None) -> tuple[Path, dict]:
    """The job's capture folder (the first of `candidates`, default `capture_candidates`, that holds a
    raw/meta.json) and its checked meta.json: a capture's (not another mode's run), with its payloads when
    `payloads` (slice and emulate replay them)."""
    candidates = capture_candidates(job) if candidates is None else candidates
    for cand in candidates:
        if meta_path(cand).is_file():
            meta = read_meta(cand)
            if not modes.captured(meta):
                raise JobError(f"{raw_dir(cand)}: a {meta.get('mode')!r} run, not a capture: capture the job "
                               "(the pipeline's capture rule, or `prism launch --mode capture --out DIR ...`)")
            if payloads and (not meta.get("payloads", False) or not payloads_dir(cand).is_dir()):
                raise JobError(f"{cand}: no payloads/ (captured with --no-payloads?): capture again with payloads")
            return cand, meta
    where = " and ".join(str(meta_path(c)) for c in candidates)
    raise JobError(f"{job}: no capture ({where} are missing): capture the job first (the pipeline's capture "
                   "rule, or `prism launch --mode capture --out DIR ...`)")


# -- the graph as sweep arrays ----------------------------------------------------------------------------
EVENT_COLUMNS = ["event_id", "rank", "seq", "kind", "op", "group_name", "iteration", "comm_id", "op_event_id",
                 "t_start_ns", "t_end_ns", "device_ns", "cpu_ns", "t_complete_ns"]
COMM_COLUMNS = ["comm_id", "kind", "n_members", "event_ids"]


class GraphTablesError(JobError):
    """The job's graph tables are missing or inconsistent; the message names the file and the event."""


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
        raise GraphTablesError(f"{path}: column {name!r} has nulls")
    return column.to_numpy().astype(np.int64)


def _read(path: Path, columns: list[str], job: Path) -> pa.Table:
    if not path.is_file():
        raise GraphTablesError(f"{path}: missing; build the graph first (`prism graph --job {job}`)")
    table = read_parquet(path)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise GraphTablesError(f"{path}: lacks columns {missing}; rebuild it with this prism (`prism graph`)")
    return table.select(columns)


def load_graph(job: str | Path) -> JobGraph:
    """The graph of ``JOB/graph`` as sweep arrays; `GraphTablesError` names the file and event at fault."""
    job = Path(job)
    ev_path, comm_path = graph_file(job, "events"), graph_file(job, "comms")
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
        raise GraphTablesError(f"{ev_path}: negative rank {int(rank[0])}")
    world = int(rank[-1]) + 1 if n else 0
    rank_ptr = np.zeros(world + 1, dtype=np.int64)
    np.cumsum(np.bincount(rank, minlength=world), out=rank_ptr[1:])
    expected = np.arange(n) - np.repeat(rank_ptr[:-1], np.diff(rank_ptr))
    bad = np.flatnonzero(seq != expected)
    if len(bad):
        i = int(bad[0])
        raise GraphTablesError(
            f"{ev_path}: rank {int(rank[i])} has seq {int(seq[i])} where {int(expected[i])} was expected; "
            "a rank's events must be numbered 0, 1, 2, ... (rebuild the graph with `prism graph`)"
        )

    event_ids = _ints(events, "event_id", ev_path)
    id_order = np.argsort(event_ids, kind="stable")
    sorted_ids = event_ids[id_order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(dup):
        raise GraphTablesError(f"{ev_path}: event_id {int(sorted_ids[dup[0]])} appears twice")
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
        raise GraphTablesError(
            f"{ev_path}: rank {int(rank[i])} seq {int(seq[i])} has kind {name!r}, not one of {KINDS}"
        )
    op_code, op_names = _codes(events.column("op"))
    group_code, group_names = _codes(events.column("group_name"))
    group_names = _with_descs(group_names, graph_file(job, "groups"))

    comm_ids = _ints(comms, "comm_id", comm_path)
    c_order = np.argsort(comm_ids, kind="stable")
    comms = comms.take(pa.array(c_order))
    comm_ids = comm_ids[c_order]
    dup = np.flatnonzero(comm_ids[1:] == comm_ids[:-1])
    if len(dup):
        raise GraphTablesError(f"{comm_path}: comm_id {int(comm_ids[dup[0]])} appears twice")
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
        raise GraphTablesError(
            f"{ev_path}: {graph.describe(i)}: comm_id {int(raw_comm[i])} is not in {comm_path.name} "
            "(an unmatched comm); rebuild the graph (`prism graph`)"
        )
    graph.comm[has] = at

    raw_op = _ints(events, "op_event_id", ev_path)
    has = np.flatnonzero(raw_op >= 0)
    pos = position(raw_op[has])
    if np.any(pos < 0):
        i = int(has[np.flatnonzero(pos < 0)[0]])
        raise GraphTablesError(f"{ev_path}: {graph.describe(i)}: op_event_id {int(raw_op[i])} is not an event")
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
        groups = read_parquet(path).select(["group_name", "group_desc"]).to_pylist()
    except (ArtifactError, KeyError, pa.ArrowInvalid):
        return names
    descs = {g["group_name"]: g["group_desc"] for g in groups if g["group_desc"] and g["group_desc"] != g["group_name"]}
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
        raise GraphTablesError(f"{path}: comm {graph.comm_name(int(owner[i]))} lists event_id {int(listed[i])}, "
                             "which is not in events.parquet")
    bad = np.flatnonzero(graph.comm[pos] != owner)
    if len(bad):
        i = int(bad[0])
        raise GraphTablesError(
            f"{path}: comm {graph.comm_name(int(owner[i]))} lists {graph.describe(int(pos[i]))}, whose comm_id is "
            f"{int(graph.comm_ids[graph.comm[pos[i]]]) if graph.comm[pos[i]] >= 0 else -1}; rebuild the graph"
        )
    n_members = comms.column("n_members").to_numpy().astype(np.int64)
    referencing = np.bincount(graph.comm[graph.comm >= 0], minlength=len(counts))
    bad = np.flatnonzero((referencing != counts) | (n_members != counts))
    if len(bad):
        c = int(bad[0])
        raise GraphTablesError(
            f"{path}: comm {graph.comm_name(c)} has n_members {int(n_members[c])} and {int(counts[c])} event_ids, "
            f"but {int(referencing[c])} events take part in it: an unmatched comm; rebuild the graph"
        )


# -- the calibrated tables' shape --------------------------------------------------------------------------
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


def id_rank(event_ids: np.ndarray) -> np.ndarray:
    """For each event position, its index among the sorted event ids."""
    out = np.empty(len(event_ids), dtype=np.int64)
    out[np.argsort(event_ids, kind="stable")] = np.arange(len(event_ids))
    return out
