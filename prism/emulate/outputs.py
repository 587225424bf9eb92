"""The emulation's artifacts, built from what ``prism launch --mode emulate --out OUT`` wrote.

OUT holds ``raw/meta.json`` (``t0_ns``: the common start of sandbox and replay on the host monotonic
clock: the barrier `prism.runtime.emulate.common_start`; each sandbox rank's first event starts there),
``raw/rank=R/events.arrow`` (each sandbox rank's PrismTrace, in the capture's program order),
``raw/replay/events.arrow`` (the virtual events the replay worker drove live: the sandbox's dependency
cone, `prism.runtime.replay.cone`), ``raw/replay/exchanges.arrow`` (its real exchanges, when each completed)
and ``logs/rank=R.log``.

- ``events``: every event of the job once, on the emulation's clock (ns from ``t0_ns``): sandbox rows
  (measured), replay rows (the cone, replayed in wall-clock time), and 'computed' rows for every other
  event — those before any real op could move them and those after the last real op they could reach —
  from the calibrate sweep with the sandbox's measured durations substituted (`prism.calibrate.substitute`):
  before a rank's first live row they keep the sweep's spacing, shifted onto its live rows (`one_clock`);
  after its last live row (and on a rank with none) they are swept by the clock rule from the live rows'
  times (`prism.emulate.tail`), so every (rank, stream) is one sequence, in order and not overlapping
  (`prism.schemas.check_timeline`), and no wait ends before its comm's last member arrived.
- ``iterations``: `prism.job.iterations_table` over that sweep for every rank ('computed'),
  and over each sandbox rank's measured timeline ('sandbox').
- ``memory``: the sandbox ranks' memory at each of their markers;
- ``delays``: the emulation's own delay per op kind of the sandbox's real exchanges (`prism.emulate.delays`;
  no rows without any);
- ``figures``: what the summary prints (`prism.emulate.results`), added by `with_figures`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism import job as job_files
from prism import artifacts, event_sequence, schemas
from prism.emulate import delays, results, tail
from prism.calibrate import substitute
from prism.calibrate.sweep import Timeline
from prism.job import JobGraph, iterations_table

class MismatchError(Exception):
    """A sandbox rank's run departs from its capture (exit 1): rank, seq and both sides named."""


@dataclass(eq=False)
class Emulation:
    """The stage's tables and what the summary reports."""

    tables: dict[str, pa.Table]
    sandbox: list[int]
    meta: dict  # the launch's raw/meta.json
    computed: Timeline  # the substituted sweep
    measured_iterations: list[int]  # iterations every sandbox rank ran for real


def align(rank: int, measured: pa.Table, graph: pa.Table, prefix: bool) -> pa.Table:
    """A sandbox rank's events checked against its capture's; `prefix`: it may stop early (``--steps``)."""
    measured = measured.sort_by("seq")
    got, want = event_sequence.sequence(measured), event_sequence.sequence(graph)
    i = event_sequence.first_departure(got, want, prefix)
    if i is not None:
        raise MismatchError(
            f"sandbox rank {rank} departed from its capture at seq {i}: the emulation has "
            f"{event_sequence.describe(got, i)}, the capture graph "
            f"{event_sequence.describe(want, i)} ({len(got)} vs {len(want)} events). A what-if may change "
            "values and compute time, not the communication (op, group, size, order)")
    return measured


def clock_offsets(meta: dict) -> dict[int, int]:
    """An emulation over hosts: rank -> its host's monotonic clock minus host 0's (ns; `meta.json`'s hosts,
    measured by the launchers, `launch.hosts.sync_clocks`); empty on one host."""
    return {r: int(h["clock_offset_ns"]) for h in meta.get("hosts") or [] if "clock_offset_ns" in h
            for r in range(*h["ranks"])}


def on_host0_clock(measured: pa.Table, offset: int) -> pa.Table:
    """A sandbox rank's events, recorded on its host's clock, on host 0's (t0_ns's): times less `offset`."""
    if not offset:
        return measured
    for name in ("t_start_ns", "t_end_ns", "t_complete_ns"):
        col = measured[name]
        shifted = pc.subtract(col, pa.scalar(offset, pa.int64()))
        if name == "t_complete_ns":  # -1: not measured
            shifted = pc.if_else(pc.equal(col, -1), col, shifted)
        i = measured.schema.get_field_index(name)
        measured = measured.set_column(i, measured.schema.field(i), shifted)  # the field as it was (not null)
    return measured


def _sandbox_tables(out: Path, sandbox: list[int], graph: pa.Table, ptr: np.ndarray, prefix: bool,
                    offsets: dict[int, int] | None = None):
    parts, rows = [], []
    for r in sandbox:
        measured = artifacts.read_raw_stream(job_files.rank_stream(out, r), schemas.RAW_EVENTS)
        measured = on_host0_clock(measured, (offsets or {}).get(r, 0))
        lo, hi = int(ptr[r]), int(ptr[r + 1])
        measured = align(r, measured, graph.slice(lo, hi - lo), prefix)
        parts.append(measured)
        rows.append(np.arange(lo, lo + measured.num_rows, dtype=np.int64))
    return parts, rows


def _replay_table(out: Path, sandbox: list[int], graph: pa.Table, ptr: np.ndarray):
    path = job_files.replay_stream(out)
    if not path.is_file():
        return None, np.empty(0, dtype=np.int64)
    replay = artifacts.read_raw_stream(path, schemas.RAW_EVENTS)
    rank = replay["rank"].to_numpy().astype(np.int64)
    seq = replay["seq"].to_numpy().astype(np.int64)
    world = len(ptr) - 1
    bad = np.flatnonzero((rank < 0) | (rank >= world) | np.isin(rank, sandbox))
    if len(bad) == 0:
        bad = np.flatnonzero((seq < 0) | (seq >= ptr[np.clip(rank + 1, 0, world)] - ptr[np.clip(rank, 0, world)]))
    if len(bad):
        i = int(bad[0])
        raise artifacts.ArtifactError(f"{path}: row {i} (rank {int(rank[i])}, seq {int(seq[i])}) is no virtual "
                                      "rank's event of the graph: the emulation ran another job")
    pos = ptr[rank] + seq
    kinds = replay["kind"].cast(pa.string()).to_pylist()
    want = graph["kind"].take(pa.array(pos)).cast(pa.string()).to_pylist()
    if kinds != want:
        i = next(i for i, (a, b) in enumerate(zip(kinds, want)) if a != b)
        raise artifacts.ArtifactError(f"{path}: rank {int(rank[i])} seq {int(seq[i])} is a {kinds[i]} in the replay "
                                      f"but a {want[i]} in the graph: the emulation ran another job")
    return replay, pos


def _with_ids(raw: pa.Table, graph: pa.Table, pos: np.ndarray) -> pa.Table:
    """Raw rows (RAW_EVENTS) as graph rows: the graph's ids at positions `pos`."""
    ids = graph.select(["event_id", "comm_id", "op_event_id"]).take(pa.array(pos))
    cols = {name: raw[name] for name in schemas.RAW_EVENTS.names}
    cols.update({name: ids[name] for name in ids.column_names})
    return pa.table(cols)


def _as_events(table: pa.Table, start: np.ndarray, end: np.ndarray, source: str) -> pa.Table:
    table = table.select(schemas.EVENTS.names).cast(schemas.EVENTS)
    return (table.append_column("start_ns", pa.array(start, pa.int64()))
            .append_column("end_ns", pa.array(end, pa.int64()))
            .append_column("source", pa.array([source] * table.num_rows, pa.string()).dictionary_encode()))


def one_clock(rank_ptr: np.ndarray, source: np.ndarray, computed: Timeline, start: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The events' times on the emulation's one clock. Live events (replay, sandbox: `source` != 0) keep their
    measured times; a computed event keeps the sweep's spacing, shifted onto the live events of its rank:

    - after a live event of its rank: delayed by the lag the last one before it ended with (its measured end
      minus its swept end, when positive), so the rank's computed tail starts when its live part ended;
    - before the rank's first live event: moved earlier by as much as that event started before its swept
      start (when it did), so the computed head ends by the time the live part began.

    Without this a replayed rank's tail kept the sweep's times while its live part ran late in wall-clock
    time: events starting before the previous one ended, two clocks in one table."""
    n = len(source)
    if not n:
        return start, end
    idx = np.arange(n, dtype=np.int64)
    rank_of = np.repeat(np.arange(len(rank_ptr) - 1, dtype=np.int64), np.diff(rank_ptr))
    live = source != 0
    prev = np.maximum.accumulate(np.where(live, idx, -1))  # the last live event at or before each event
    nxt = np.minimum.accumulate(np.where(live, idx, n)[::-1])[::-1]  # the first at or after
    has_prev = (prev >= 0) & (rank_of[np.clip(prev, 0, n - 1)] == rank_of)
    has_next = (nxt < n) & (rank_of[np.clip(nxt, 0, n - 1)] == rank_of)
    lag = np.where(live, np.maximum(0, end - computed.end_ns), 0)
    lead = np.where(live, np.minimum(0, start - computed.start_ns), 0)
    shift = np.where(~live & has_prev, lag[np.clip(prev, 0, n - 1)], 0)
    shift = np.where(~live & ~has_prev & has_next, lead[np.clip(nxt, 0, n - 1)], shift)
    return start + shift, end + shift


def build(job: JobGraph, graph: pa.Table, out: Path, sandbox: list[int], durations: np.ndarray,
          transfers: np.ndarray, steps: int | None = None, spent: bool = True) -> Emulation:
    """The emulation's tables from the launch's OUT folder (see the module docstring).

    `graph` is ``graph/events.parquet`` in (rank, seq) order, `durations` / `transfers` the calibrated
    ones (`substitute.calibrated_inputs`); `steps` set: the sandbox may have stopped early; `spent`: the
    sandbox's compute and markers by their spent span, as slice runs' are (False for a bare-graph calibration:
    `substitute.measured_by_slices`).
    """
    meta = json.loads(job_files.meta_path(out).read_text())
    t0 = int(meta["t0_ns"])
    ptr = job.graph.rank_ptr
    parts, rows = _sandbox_tables(out, sandbox, graph, ptr, steps is not None, clock_offsets(meta))
    replay, replay_pos = _replay_table(out, sandbox, graph, ptr)

    sb_rows = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
    sb = pa.concat_tables(parts) if parts else None
    col = {name: sb[name].to_numpy().astype(np.int64) for name in
           ("device_ns", "cpu_ns", "t_start_ns", "t_end_ns", "t_complete_ns")}
    dur = substitute.substitute_measured(job, durations, sb_rows, col["device_ns"], col["t_start_ns"],
                                         col["t_end_ns"], col["t_complete_ns"], cpu_ns=col["cpu_ns"], spent=spent)
    computed = substitute.sweep(job, dur, transfers)

    n = job.graph.n_events
    start, end = computed.start_ns.copy(), computed.end_ns.copy()
    source = np.zeros(n, dtype=np.int8)  # 0 computed, 1 replay, 2 sandbox
    if replay is not None:
        start[replay_pos] = replay["t_start_ns"].to_numpy() - t0
        end[replay_pos] = replay["t_end_ns"].to_numpy() - t0
        source[replay_pos] = 1
    start[sb_rows] = col["t_start_ns"] - t0
    end[sb_rows] = col["t_end_ns"] - t0
    source[sb_rows] = 2
    start, end = one_clock(ptr, source, computed, start, end)
    start, end = tail.sweep_tails(job.graph, source != 0, dur, transfers, start, end)

    pieces = []
    rest = np.flatnonzero(source == 0)
    pieces.append(_as_events(graph.take(pa.array(rest)), start[rest], end[rest], "computed"))
    if replay is not None and replay.num_rows:
        pieces.append(_as_events(_with_ids(replay, graph, replay_pos), start[replay_pos], end[replay_pos], "replay"))
    if sb is not None:
        pieces.append(_as_events(_with_ids(sb, graph, sb_rows), start[sb_rows], end[sb_rows], "sandbox"))
    events = pa.concat_tables(pieces).sort_by([("rank", "ascending"), ("seq", "ascending")])

    it_computed = iterations_table(job, computed)
    # the sandbox's measured iterations: unmeasured events (after --steps) get a sentinel, and the
    # iterations that touch one are dropped (measured times may be < 0: events before the common start)
    unmeasured = -(2**62)
    only = np.full(n, unmeasured, dtype=np.int64), np.full(n, unmeasured, dtype=np.int64)
    only[0][sb_rows], only[1][sb_rows] = start[sb_rows], end[sb_rows]
    it_sb = iterations_table(job, Timeline(only[0], only[1], computed.comm_start_ns, computed.comm_end_ns))
    it_sb = it_sb.filter(pc.and_(pc.is_in(it_sb["rank"], pa.array(sandbox, pa.int32())),
                                 pc.and_(pc.not_equal(it_sb["start_ns"], unmeasured),
                                         pc.not_equal(it_sb["end_ns"], unmeasured))))
    iterations = pa.concat_tables([
        it_computed.append_column("source", pa.array(["computed"] * it_computed.num_rows).dictionary_encode()),
        it_sb.append_column("source", pa.array(["sandbox"] * it_sb.num_rows).dictionary_encode()),
    ])
    measured = results.compared_iterations(iterations)

    memory = _memory(sb, t0) if sb is not None else None
    tables = {"events": events, "iterations": iterations, "delays": delays.from_launch(out, events, measured)}
    if memory is not None:
        tables["memory"] = memory
    return Emulation(tables, sandbox, meta, computed, measured)


def _memory(sb: pa.Table, t0: int) -> pa.Table:
    marks = sb.filter(pc.equal(sb["kind"].cast(pa.string()), "marker"))
    return pa.table({
        "rank": marks["rank"], "seq": marks["seq"], "iteration": marks["iteration"],
        "microbatch": marks["microbatch"], "marker": marks["op"],
        "t_ns": pc.subtract(marks["t_end_ns"], pa.scalar(t0, pa.int64())),
        "mem_bytes": marks["mem_bytes"], "mem_peak_bytes": marks["mem_peak_bytes"],
    })


SCHEMAS = {"events": schemas.EMULATION_EVENTS, "iterations": schemas.EMULATION_ITERATIONS,
           "memory": schemas.EMULATION_MEMORY, "figures": schemas.EMULATION_FIGURES,
           "delays": schemas.EMULATION_DELAYS}


# --------------------------------------------------------------------------------------------- summary


def with_figures(em: Emulation, calibrated: pa.Table) -> Emulation:
    """`em` with its ``figures`` table (`prism.emulate.results`), against the calibrated iterations."""
    em.tables["figures"] = results.figures_table(results.figures(em.tables["iterations"], calibrated))
    return em

job_iteration_ns = results.job_iteration_ns  # the one computation, `prism.emulate.results`


def summary(em: Emulation, job_dir: Path, calibrated: pa.Table, devices: int | None, seconds: float) -> str:
    fig = results.figures(em.tables["iterations"], calibrated)
    keep = fig.iterations
    stats = em.meta.get("emulation", {})
    lines = [
        f"prism emulate of {job_dir}: sandbox rank(s) {','.join(map(str, em.sandbox))} of W={em.meta.get('world_size')}"
        f" on {em.meta.get('devices') or devices or '?'} device(s), {len(keep)} iteration(s) emulated ({', '.join(map(str, keep))}), "
        f"{seconds:.1f} s",
        "",
        *results.text_lines(fig),
        "",
        *delays.text_lines(em.tables["delays"]),
    ]
    if stats:
        lines += ["", "emulation: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items()))]
    lines += ["", f"artifacts: {job_files.emulation(job_dir)}/{{events,iterations,memory,figures,delays}}.parquet, "
              "logs/rank=R.log",
              f"query: prism sql --job {job_dir} \"SELECT source, count(*) FROM emulation.events GROUP BY 1\""]
    return "\n".join(lines) + "\n"


__all__ = ["Emulation", "MismatchError", "SCHEMAS", "align", "build", "one_clock", "job_iteration_ns", "summary", "with_figures"]
