"""The artifact contracts: every Arrow schema prism writes, in one place.

The runtime writes the raw per-rank streams (`RAW_EVENTS`, `RAW_GROUPS`); the analysis stages read them
and write the graph tables (`EVENTS`, `COMMS`, `GROUPS`, `RANKS`). Neither side imports the other's
internals: these schemas are the contract. `python -m prism.schemas --export schemas/` writes them as
JSON next to the config schema; a test keeps that folder equal to this module.

Every artifact carries ``schema_version`` in its key-value metadata (`with_version`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa

# 2: the columns `group` and `desc` (SQL keywords) became `group_name` and `group_desc`; an artifact of
# version 1 is refused with "re-run the stage that wrote it" (`prism.artifacts.check_version`)
SCHEMA_VERSION = "2"

_dict = pa.dictionary(pa.int32(), pa.string())

# Event kinds. A rank's stream is a sequence of these, in program order.
KIND_COMPUTE = "compute"  # the span between two communication calls
KIND_COLLECTIVE = "collective"  # a collective issued on a group
KIND_SEND = "send"
KIND_RECV = "recv"
KIND_WAIT = "wait"  # the program waited on an async op (work_id links it to the op)
KIND_MARKER = "marker"  # iteration / microbatch / backward markers from the global hooks
EVENT_KINDS = (KIND_COMPUTE, KIND_COLLECTIVE, KIND_SEND, KIND_RECV, KIND_WAIT, KIND_MARKER)
COMM_KINDS = (KIND_COLLECTIVE, KIND_SEND, KIND_RECV)
# The op of a recv from any source (`dist.recv(t)` without src): its `peer` is the rank it received from,
# known only once it completed (so a slice run checks it with peer -1, as it is issued).
OP_RECV_ANYSOURCE = "recv_anysource"

# One row per event of one rank (raw stream, Arrow IPC, `raw/rank=R/events.arrow`).
RAW_EVENT_FIELDS = [
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),  # program order on this rank, from 0
    pa.field("kind", _dict, nullable=False),
    pa.field("op", _dict, nullable=False),  # all_reduce, send, fwd_begin, iteration_end, ...
    pa.field("group_name", _dict),  # torch's name of the process group (null: none)
    pa.field("group_seq", pa.int64(), nullable=False),  # per-group sequence number of the op, -1: none
    # global rank: p2p peer (recv_anysource: the actual sender), or root of broadcast/reduce/...; -1
    pa.field("peer", pa.int32(), nullable=False),
    pa.field("tag", pa.int32(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),  # bytes this rank contributes (input tensors)
    pa.field("dtype", _dict),
    pa.field("shape", _dict),  # shape of the first tensor, e.g. "4x64"
    pa.field("is_async", pa.bool_(), nullable=False),  # other events ran between issue and wait
    pa.field("work_id", pa.int64(), nullable=False),  # links an op to its wait, -1: none
    pa.field("iteration", pa.int32(), nullable=False),  # optimizer steps completed before this event
    pa.field("microbatch", pa.int32(), nullable=False),  # forward index in this iteration, -1: outside
    pa.field("t_start_ns", pa.int64(), nullable=False),  # host monotonic clock (shared by the host)
    pa.field("t_end_ns", pa.int64(), nullable=False),
    # CPU time of the recording thread inside the event (thread_time); -1: the span changed thread (CUDA
    # backward passes run on torch's device thread) or not measured
    pa.field("cpu_ns", pa.int64(), nullable=False),
    # CUDA: GPU time between the event's boundaries on the rank's current stream (CUDA events); CPU: no
    # device clock, the same thread CPU time as cpu_ns; -1: not measured
    pa.field("device_ns", pa.int64(), nullable=False),
    # when the op's result was ready: exact for ops consumed through their future (a completion callback),
    # an upper bound for waited ops (the wait's start if the result was already there, else its end); -1
    pa.field("t_complete_ns", pa.int64(), nullable=False),
    pa.field("mem_bytes", pa.int64(), nullable=False),  # memory in use at the event's end; -1: not measured
    pa.field("mem_peak_bytes", pa.int64(), nullable=False),  # peak so far; -1: not measured
    # CUDA: the caching allocator's reserved bytes at the event's end; -1: not measured (CPU: no allocator)
    pa.field("mem_reserved_bytes", pa.int64(), nullable=False),
    pa.field("stream", pa.int32(), nullable=False),  # 0: the program's stream
]
RAW_EVENTS = pa.schema(RAW_EVENT_FIELDS)

# One row per process group this rank created (`raw/rank=R/groups.arrow`).
RAW_GROUPS = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("group_name", pa.string(), nullable=False),  # torch's name of the process group
        pa.field("group_desc", pa.string()),  # group_desc given by the program ("tp", "dp", ... or torch's)
        pa.field("members", pa.list_(pa.int32()), nullable=False),  # global ranks, in group-rank order
        pa.field("backend", pa.string(), nullable=False),  # the backend the program asked for
    ]
)

# Capture mode: one row per contribution this rank made (`raw/rank=R/payloads.arrow`); the bytes are in
# the job's content-addressed payload store (`payloads/<hash[:2]>/<hash>.bin`).
RAW_PAYLOADS = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("work_id", pa.int64(), nullable=False),  # the op event's work_id in this rank's stream
        pa.field("key", pa.string(), nullable=False),  # the communication key (collective or message)
        # "in": the rank's contribution (what a replay sends); "out": the capture's result of a reduction
        # that slice runs must reproduce bitwise (groups of > 2 members, whose real reduction order differs)
        pa.field("role", pa.string(), nullable=False),
        pa.field("hash", pa.string(), nullable=False),  # content hash (blake2b-128, hex)
        pa.field("nbytes", pa.int64(), nullable=False),
    ]
)

# Graph tables (`graph/*.parquet`), one per job.
EVENTS = pa.schema(
    [pa.field("event_id", pa.int64(), nullable=False)]
    + RAW_EVENT_FIELDS
    + [
        pa.field("comm_id", pa.int64(), nullable=False),  # the comms row this event takes part in, -1
        pa.field("op_event_id", pa.int64(), nullable=False),  # for a wait: the op it waits on, -1
    ]
)

COMMS = pa.schema(
    [
        pa.field("comm_id", pa.int64(), nullable=False),
        pa.field("kind", _dict, nullable=False),  # collective | p2p
        pa.field("op", _dict, nullable=False),
        pa.field("group_name", _dict),
        pa.field("group_seq", pa.int64(), nullable=False),  # collectives: per-group sequence; p2p: -1
        pa.field("src", pa.int32(), nullable=False),  # p2p: sender; collective: root or -1
        pa.field("dst", pa.int32(), nullable=False),  # p2p: receiver; -1
        pa.field("tag", pa.int32(), nullable=False),
        pa.field("n_members", pa.int32(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),  # total bytes contributed by the members
        pa.field("members", pa.list_(pa.int32()), nullable=False),
        pa.field("event_ids", pa.list_(pa.int64()), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("t_first_start_ns", pa.int64(), nullable=False),
        pa.field("t_last_start_ns", pa.int64(), nullable=False),
        pa.field("t_last_end_ns", pa.int64(), nullable=False),
    ]
)

GROUPS = pa.schema(
    [
        pa.field("group_name", pa.string(), nullable=False),
        pa.field("group_desc", pa.string()),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("members", pa.list_(pa.int32()), nullable=False),
        pa.field("ring", pa.list_(pa.int32()), nullable=False),  # ring order used by ring collectives
        pa.field("backend", pa.string(), nullable=False),
    ]
)

RANKS = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("node", pa.string(), nullable=False),
        pa.field("tp", pa.int32(), nullable=False),  # coordinates derived from group membership, -1
        pa.field("pp", pa.int32(), nullable=False),
        pa.field("dp", pa.int32(), nullable=False),
        pa.field("ep", pa.int32(), nullable=False),
        pa.field("n_events", pa.int64(), nullable=False),
        pa.field("iterations", pa.int32(), nullable=False),
        pa.field("iteration_rule", pa.string()),  # what found the iterations (prism.runtime.markers' rules)
        pa.field("microbatch_rule", pa.string()),
    ]
)

# The slice plan (`slices/plan.parquet`): which ranks run for real together, and which slice's
# measurement stands for each slice (itself, or an equivalent one with --representative).
SLICE_PLAN = pa.schema(
    [
        pa.field("slice", pa.int32(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("rank_class", pa.string(), nullable=False),  # PP stage + digest of the op sequence
        pa.field("measured_by", pa.int32(), nullable=False),
        pa.field("measured", pa.bool_(), nullable=False),
    ]
)

# A slice run (`slices/slice=K/events.parquet`): the events of the slice's ranks, measured while they ran
# for real together (the other ranks replayed). Same columns as the graph's EVENTS, rows aligned with the
# capture graph's events of those ranks (same event_id, comm_id, op_event_id), times from the slice run.
SLICE_EVENTS = pa.schema(list(EVENTS))

# A timed slice run (`slices_timed/slice=K/replay.parquet`): when the replay server issued each op between a
# slice rank and replayed ones (its virtual members' calibrated arrival, or later), on the slice's clock.
SLICE_REPLAY = pa.schema(
    [
        pa.field("comm_id", pa.int64(), nullable=False),
        pa.field("t_issue_ns", pa.int64(), nullable=False),
    ]
)

# A slice run's replay server, op by op (`slices/slice=K/replay_ops.parquet`, every pass): what it played for the
# virtual members of each op with a slice rank, on the slice's clock (host monotonic ns). `t_ready_ns`: when it
# could have issued (the payloads loaded, a free in-flight slot; timed: also the calibrated arrival reached);
# `t_issue_ns` / `t_issued_ns`: its first issue call began / its last returned (one call a virtual member);
# `t_complete_ns`: it saw every virtual member's part complete. `comm_id`: the graph's comm (-1: not found
# among the slice ranks' events). kind: collective, send (virtual -> slice) or recv (slice -> virtual).
SLICE_REPLAY_OPS = pa.schema(
    [
        pa.field("comm_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("group_name", pa.string(), nullable=False),
        pa.field("group_seq", pa.int64(), nullable=False),  # a message: its index in its channel
        pa.field("src", pa.int32(), nullable=False),  # a message's ends (global ranks), else -1
        pa.field("dst", pa.int32(), nullable=False),
        pa.field("tag", pa.int64(), nullable=False),
        pa.field("virtual_members", pa.int32(), nullable=False),
        pa.field("t_ready_ns", pa.int64(), nullable=False),
        pa.field("t_issue_ns", pa.int64(), nullable=False),
        pa.field("t_issued_ns", pa.int64(), nullable=False),
        pa.field("t_complete_ns", pa.int64(), nullable=False),
    ]
)

# The calibrated timeline (`calibrated/timeline.parquet`): every event on one global clock, ns from the
# job's start (every rank starts at 0).
TIMELINE = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("event_id", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

# Per rank and iteration on that clock (`calibrated/iterations.parquet`): iteration k spans from the end
# of the rank's (k-1)-th iteration_end marker (or its first event) to the end of its k-th.
ITERATIONS = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("duration_ns", pa.int64(), nullable=False),
    ]
)

# The critical path of each iteration of the calibrated timeline (`calibrated/critical_path.parquet`): its events
# in time order (step 0 first), walked back from the iteration's last iteration_end marker.
CRITICAL_PATH = pa.schema(
    [
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("event_id", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

# The emulation (`emulation/events.parquet`): every event of the job on the emulation's clock (ns from its
# start), the graph's columns as measured by the row's source: 'sandbox' (a sandbox rank's real run),
# 'replay' (a virtual rank the replay worker drove in wall-clock time), 'computed' (the calibrate sweep with
# the sandbox's measured durations substituted: before a rank's live rows shifted onto their clock,
# `prism.emulate.outputs.one_clock`; after them swept by the clock rule from the live rows' times,
# `prism.emulate.tail`; so each (rank, stream) is one sequence and no wait ends before its comm's last
# arrival; the unshifted sweep is what `EMULATION_ITERATIONS`' 'computed' rows hold).
EMULATION_EVENTS = pa.schema(
    list(EVENTS)
    + [
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("source", _dict, nullable=False),
    ]
)

# Per rank and iteration of the emulation (`emulation/iterations.parquet`), as `ITERATIONS`: 'computed' rows
# for every rank (the substituted sweep: the job's prediction under the sandbox's measured behaviour),
# 'sandbox' rows for each sandbox rank (its measured timeline).
EMULATION_ITERATIONS = pa.schema(list(ITERATIONS) + [pa.field("source", _dict, nullable=False)])

# The emulation's figures (`emulation/figures.parquet`, `prism.emulate.results`: what its summary and the report
# show), ms over the iterations every sandbox rank ran for real: one row for the job (rank -1) and one per sandbox
# rank. under_sandbox_ms: the job's (its rank's) iteration time in the job under the sandbox's measured behaviour;
# measured_ms: the sandbox rank's own, measured; delay_ms = measured - under_sandbox: the emulation's own delay.
EMULATION_FIGURES = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("predicted_ms", pa.float64()),
        pa.field("under_sandbox_ms", pa.float64()),
        pa.field("measured_ms", pa.float64()),
        pa.field("delay_ms", pa.float64()),
        pa.field("iterations", pa.list_(pa.int32()), nullable=False),
    ]
)

# The real exchanges of an emulation (``raw/replay/exchanges.arrow``, the replay worker's: `prism.runtime.replay.
# clock.TimedReplay.exchanges_table`), one row per comm between a sandbox rank and replayed ones that completed,
# times in ns from the emulation's start t0: when the real exchange completed on the worker's side
# (`completed_ns`), the last virtual member's arrival at it then (`virtual_arrival_ns`: a replayed rank's live
# arrival, or a calibrated one), its calibrated transfer (>= 0) and the calibrated timeline's completion (null:
# none). op: a collective's op, or 'send/recv' for a message.
RAW_EXCHANGES = pa.schema(
    [
        pa.field("comm_id", pa.int64(), nullable=False),
        pa.field("op", _dict, nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("completed_ns", pa.int64(), nullable=False),
        pa.field("virtual_arrival_ns", pa.int64(), nullable=False),
        pa.field("transfer_ns", pa.int64(), nullable=False),
        pa.field("calibrated_completion_ns", pa.int64()),
    ]
)

# The emulation's own delay per op kind (`emulation/delays.parquet`, `prism.emulate.delays`: what its summary and
# the report show), one row per op kind of the sandbox's real exchanges (its comms with replayed ranks; none: no
# rows). `late_*_ms` (median, p95, max, mean over the kind's `n` exchanges): how late each completed against the
# model's completion for the arrivals as they happened, every member's (the sandbox's measured issues, the replayed
# ranks' live or calibrated ones) + the calibrated transfer (`prism.clock_rule`): the emulation's own lateness (its
# replay and transport), not the program's; < 0: done before the model's completion (a collective is then held
# to it). `late_ms_per_iteration`: the positive part of that lateness summed over the kind's exchanges of an
# iteration, mean over the iterations timed (`iterations` but the first, as the figures' iteration times; null:
# none). `vs_calibrated_*_ms`: against the calibrated timeline's completion instead: a shift of the whole timeline
# up to the exchange, which every earlier delay moves, the program's (the sandbox's own speed) and the emulation's
# (null: no calibrated completion).
EMULATION_DELAYS = pa.schema(
    [
        pa.field("op", pa.string(), nullable=False),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("late_median_ms", pa.float64(), nullable=False),
        pa.field("late_p95_ms", pa.float64(), nullable=False),
        pa.field("late_max_ms", pa.float64(), nullable=False),
        pa.field("late_mean_ms", pa.float64(), nullable=False),
        pa.field("late_ms_per_iteration", pa.float64()),
        pa.field("vs_calibrated_median_ms", pa.float64()),
        pa.field("vs_calibrated_p95_ms", pa.float64()),
        pa.field("vs_calibrated_max_ms", pa.float64()),
        pa.field("vs_calibrated_mean_ms", pa.float64()),
        pa.field("iterations", pa.list_(pa.int32()), nullable=False),
    ]
)

# The sandbox ranks' memory at each marker of their real run (`emulation/memory.parquet`).
EMULATION_MEMORY = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("microbatch", pa.int32(), nullable=False),
        pa.field("marker", _dict, nullable=False),  # fwd_begin, bwd_end, iteration_end, ...
        pa.field("t_ns", pa.int64(), nullable=False),  # the marker's end, ns from the emulation's start
        pa.field("mem_bytes", pa.int64(), nullable=False),
        pa.field("mem_peak_bytes", pa.int64(), nullable=False),
    ]
)

ALL: dict[str, pa.Schema] = {
    "raw_events": RAW_EVENTS,
    "raw_groups": RAW_GROUPS,
    "raw_payloads": RAW_PAYLOADS,
    "raw_exchanges": RAW_EXCHANGES,
    "events": EVENTS,
    "comms": COMMS,
    "groups": GROUPS,
    "ranks": RANKS,
    "slice_plan": SLICE_PLAN,
    "slice_events": SLICE_EVENTS,
    "slice_replay": SLICE_REPLAY,
    "slice_replay_ops": SLICE_REPLAY_OPS,
    "timeline": TIMELINE,
    "iterations": ITERATIONS,
    "critical_path": CRITICAL_PATH,
    "emulation_events": EMULATION_EVENTS,
    "emulation_iterations": EMULATION_ITERATIONS,
    "emulation_memory": EMULATION_MEMORY,
    "emulation_figures": EMULATION_FIGURES,
    "emulation_delays": EMULATION_DELAYS,
}


# ------------------------------------------------------------------------------------------ one clock

# The time columns of a timeline table, checked in this order: the first pair a table has is its clock
# (the emulation's events carry the graph's measured t_start_ns too, but start_ns / end_ns are its clock).
TIME_COLUMNS = (("start_ns", "end_ns"), ("t_start_ns", "t_end_ns"))


class TimelineError(ValueError):
    """A timeline table mixes clocks: a (rank, stream)'s events out of order or overlapping."""


def timeline_problem(table: pa.Table) -> str | None:
    """Why `table` is not one clock per timeline, or None: per (rank, stream) (per rank when the table has no
    stream column), its events in seq order must not end before they start nor start before the previous
    one ends. Tables without rank, seq and a pair of `TIME_COLUMNS` are not timelines (None)."""
    names = set(table.column_names)
    pair = next((p for p in TIME_COLUMNS if set(p) <= names), None)
    if pair is None or not {"rank", "seq"} <= names or table.num_rows == 0:
        return None
    import numpy as np  # noqa: PLC0415 (numpy only where a timeline is checked)

    rank = table["rank"].to_numpy().astype(np.int64)
    stream = table["stream"].to_numpy().astype(np.int64) if "stream" in names else np.zeros_like(rank)
    seq = table["seq"].to_numpy().astype(np.int64)
    start = table[pair[0]].to_numpy().astype(np.int64)
    end = table[pair[1]].to_numpy().astype(np.int64)
    order = np.lexsort((seq, stream, rank))
    rank, stream, seq, start, end = rank[order], stream[order], seq[order], start[order], end[order]
    bad = np.flatnonzero(end < start)
    if len(bad):
        i = int(bad[0])
        return (f"rank {rank[i]} stream {stream[i]} seq {seq[i]} ends {start[i] - end[i]} ns before it starts "
                f"({pair[0]} {start[i]}, {pair[1]} {end[i]}; {len(bad)} such event(s))")
    same = (rank[1:] == rank[:-1]) & (stream[1:] == stream[:-1])
    early = np.flatnonzero(same & (start[1:] < end[:-1]))
    if len(early):
        i = int(early[0])
        return (f"rank {rank[i + 1]} stream {stream[i + 1]} seq {seq[i + 1]} starts {end[i] - start[i + 1]} ns before "
                f"seq {seq[i]} ends ({pair[0]} {start[i + 1]} < {pair[1]} {end[i]}; {len(early)} such overlap(s)): "
                "two clocks in one timeline")
    return None


def check_timeline(table: pa.Table, what: str) -> None:
    """Raise `TimelineError` naming `what` (the artifact) when `timeline_problem` finds one: what every stage
    runs on the timelines it writes (`prism.artifacts.write_outputs`, `write_parquet`)."""
    problem = timeline_problem(table)
    if problem is not None:
        raise TimelineError(f"{what}: not one clock per (rank, stream): {problem}")


def with_version(schema: pa.Schema, **extra: str) -> pa.Schema:
    """The schema with ``schema_version`` (and any extra key-value pairs) in its metadata."""
    meta = dict(schema.metadata or {})
    meta[b"schema_version"] = SCHEMA_VERSION.encode()
    for key, value in extra.items():
        meta[key.encode()] = str(value).encode()
    return schema.with_metadata(meta)


def to_json(schema: pa.Schema) -> dict:
    """A plain JSON description of a schema (what `schemas/` holds)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "fields": [
            {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema
        ],
    }


def export(folder: Path) -> list[Path]:
    """Write every schema as `folder/<name>.schema.json`; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in ALL.items():
        path = folder / f"{name}.schema.json"
        path.write_text(json.dumps(to_json(schema), indent=2) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.schemas", description=__doc__)
    parser.add_argument("--export", type=Path, required=True, help="folder to write the JSON schemas to")
    args = parser.parse_args(argv)
    for path in export(args.export):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
