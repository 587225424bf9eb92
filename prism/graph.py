"""The graph stage: merge every rank's raw stream into the bare graph of the job.

``prism graph --job DIR`` reads ``DIR/raw/rank=R/{events,groups}.arrow`` and ``DIR/raw/meta.json``
and writes ``DIR/graph/{events,comms,groups,ranks}.parquet`` (all or none). `build_graph` is the pure
function behind it. What it makes explicit:

- comm matching (`prism.graph_matching`): a collective instance is the events of every member of its
  group at one (group, group_seq); the k-th send from a to b with tag t pairs with the k-th recv on b from a with tag t;
- async op -> wait: ``events.op_event_id`` of a wait is the event of the op with the same work_id;
- rank coordinates: for a group whose desc is tp/pp/dp/ep the coordinate is the rank's index in it.
  Without such descs (DeviceMesh, DDP), a family of groups with one desc, one size, pairwise disjoint
  and covering every rank is one dimension; it is named tp/pp/dp/ep when its desc contains exactly one
  of those words (``mesh_tp``, ``dp_shard``). Coordinates nothing names (DDP's lone ``default_pg``, or
  two families claiming one name) stay -1.
- ``ranks.iterations``: the number of ``iteration_end`` markers, or max(iteration) + 1 without markers;
  ``ranks.iteration_rule`` / ``microbatch_rule``: the rule that found them (from meta.json's
  ``boundaries``, written by the launcher: `prism.runtime.markers`). Ranks that disagree on the number of
  iterations, or a named boundary function that never ran, are a `GraphError` naming the ranks.

Every inconsistency (a collective some members never issued, an unmatched send or recv, a wait on an
unknown op, ranks disagreeing on an op) is one `GraphError` naming the rank, event and group.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from prism import folder_lock
from prism import job as job_files
from prism import schemas
from prism.artifacts import ArtifactError, read_raw_stream, same_run, write_outputs
from prism.graph_matching import (GraphError, check_comm_events, match_collectives, match_p2p, ranks_str,
                                  wait_targets)

DIMS = ("tp", "pp", "dp", "ep")
_DIM_WORD = re.compile(r"(?<![a-z0-9])(tp|pp|dp|ep)(?![a-z0-9])")




# ---------------------------------------------------------------------------------------------- reading


def _rank_dirs(raw_dir: Path, world: int) -> list[Path]:
    found: dict[int, Path] = {}
    for path in raw_dir.glob("rank=*"):
        try:
            found[int(path.name.split("=", 1)[1])] = path
        except ValueError:
            raise GraphError(f"{path}: not a rank folder (expected rank=<int>)") from None
    if not found:
        raise GraphError(f"{raw_dir}: no rank=R folders; run the capture first "
                         "(`prism launch --mode capture --out JOB ...`, or `make demo`)")
    missing = sorted(set(range(world)) - set(found))
    extra = sorted(set(found) - set(range(world)))
    expected = f"meta.json says world_size={world}, expected rank=0..{world - 1}"
    if missing:
        raise GraphError(
            f"{raw_dir}: ranks {ranks_str(missing)} missing ({expected}); "
            "the capture was interrupted or those ranks crashed: see their logs"
        )
    if extra:
        raise GraphError(
            f"{raw_dir}: unexpected ranks {ranks_str(extra)} ({expected}); "
            "left over from an earlier, larger run? clear the folder and re-run the capture"
        )
    return [found[r] for r in range(world)]


def _decode(table: pa.Table) -> pa.Table:
    """Dictionary columns as plain strings (ranks' streams carry different dictionaries)."""
    fields = [
        pa.field(f.name, pa.string(), f.nullable) if pa.types.is_dictionary(f.type) else f
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def _read_ranks(rank_dirs: list[Path]) -> tuple[pa.Table, pa.Table]:
    """All ranks' events (rank-major, seq order, with ``event_id``) and group rows, checked for order."""
    def read(d: Path) -> tuple[pa.Table, pa.Table]:
        return (_decode(read_raw_stream(job_files.stream_file(d, "events"), schemas.RAW_EVENTS)),
                read_raw_stream(job_files.stream_file(d, "groups"), schemas.RAW_GROUPS))

    # one rank's streams cost ~10 ms of Arrow work (read, cast), which releases the GIL: at thousands of
    # ranks, reading them on every core is what keeps this stage's cost per event flat
    with ThreadPoolExecutor(max_workers=min(32, len(os.sched_getaffinity(0)))) as pool:
        pairs = list(pool.map(read, rank_dirs))
    events = [e for e, _ in pairs]
    groups = [g for _, g in pairs]
    for name, tables in (("events.arrow", events), ("groups.arrow", groups)):
        counts = np.array([t.num_rows for t in tables], dtype=np.int64)
        found = pl.from_arrow(pa.concat_tables(tables).select(["rank"]))["rank"].to_numpy()
        bad = np.flatnonzero(found != np.repeat(np.arange(len(tables)), counts))
        if len(bad):
            rank = int(np.searchsorted(np.cumsum(counts), bad[0], side="right"))
            raise GraphError(
                f"{rank_dirs[rank] / name}: holds rows of rank {found[bad[0]]}; the raw folders are mixed up"
            )
    counts = np.array([t.num_rows for t in events], dtype=np.int64)
    table = pa.concat_tables(events)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    seq = table.column("seq").to_numpy()
    bad = np.flatnonzero(seq != np.arange(table.num_rows) - starts)
    if len(bad):
        row = int(bad[0])
        rank = int(table.column("rank")[row].as_py())
        raise GraphError(
            f"{job_files.stream_file(rank_dirs[rank], 'events')}: row {row - starts[row]} has seq {seq[row]}, expected "
            f"{row - starts[row]}; events must be in program order without gaps (a lost batch?)"
        )
    _check_durations(table, rank_dirs)
    table = table.add_column(0, "event_id", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table, pa.concat_tables(groups)


def _check_durations(table: pa.Table, rank_dirs: list[Path]) -> None:
    """No duration is negative: an event ends after it starts, and its clocks read >= 0 (-1: not measured)."""
    t0, t1 = table.column("t_start_ns").to_numpy(), table.column("t_end_ns").to_numpy()
    for name, bad in (("t_end_ns < t_start_ns", t1 < t0),
                      ("cpu_ns", table.column("cpu_ns").to_numpy() < -1),
                      ("device_ns", table.column("device_ns").to_numpy() < -1)):
        rows = np.flatnonzero(bad)
        if len(rows):
            row = int(rows[0])
            rank, seq = table.column("rank")[row].as_py(), table.column("seq")[row].as_py()
            raise GraphError(
                f"{job_files.stream_file(rank_dirs[rank], 'events')}: event seq {seq} of rank {rank} "
                f"({table.column('kind')[row]} {table.column('op')[row]}) has a negative duration ({name}); "
                f"{len(rows)} such events: the "
                "recorder that wrote it is broken (re-record with this prism)"
            )


# ----------------------------------------------------------------------------------------------- groups


def _merge_groups(raw_groups: pl.DataFrame) -> pl.DataFrame:
    keyed = raw_groups.with_columns(
        key=pl.col("members").list.eval(pl.element().cast(pl.String)).list.join(",")
    )
    conflicts = (
        keyed.group_by("group_name", maintain_order=True).agg(pl.col("key").n_unique()).filter(pl.col("key") > 1)
    )
    if conflicts.height:
        name = conflicts["group_name"][0]
        rows = keyed.filter(pl.col("group_name") == name).unique("key", keep="first", maintain_order=True)
        a, b = rows.row(0, named=True), rows.row(1, named=True)
        raise GraphError(
            f"group {name!r}: rank {a['rank']} has members {a['members']}, rank {b['rank']} has "
            f"{b['members']}; a group name must mean one set of ranks across the job"
        )
    groups = (
        keyed.group_by("group_name", maintain_order=True)
        .agg(
            pl.col("group_desc").drop_nulls().first(),
            pl.col("members").first(),
            pl.col("backend").first(),
        )
        .with_columns(size=pl.col("members").list.len().cast(pl.Int32))
    )
    dup = groups.filter(pl.col("members").list.n_unique() != pl.col("size"))
    if dup.height:
        raise GraphError(f"group {dup['group_name'][0]!r}: members {dup['members'][0]} repeat a rank")
    return groups.with_columns(ring=pl.col("members"))


def _member_positions(groups: pl.DataFrame) -> pl.DataFrame:
    """(group, rank, pos): every member's index in its group."""
    return (
        groups.select("group_name", "group_desc", "size", rank=pl.col("members"))
        .with_columns(pos=pl.int_ranges(0, pl.col("rank").list.len()))
        .explode(["rank", "pos"])
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("pos").cast(pl.Int32))
    )


# ----------------------------------------------------------------------------------------------- ranks


def _coordinates(groups: pl.DataFrame, positions: pl.DataFrame, world: int) -> dict[str, pl.DataFrame]:
    """dim -> (rank, pos) for every dimension the groups name."""
    desc = pl.col("group_desc").fill_null("").str.to_lowercase()
    found: dict[str, pl.DataFrame] = {}
    for dim in DIMS:
        rows = positions.filter(desc == dim)
        if rows.height:
            found[dim] = rows.unique("rank", keep="first", maintain_order=True).select("rank", "pos")
    claims: dict[str, list[tuple[str, int]]] = {}
    for family, members in _families(groups, desc):
        words = set(_DIM_WORD.findall(family[0].lower()))
        if len(words) == 1 and _covers(members, world):
            claims.setdefault(words.pop(), []).append(family)
    for dim, families in claims.items():
        if dim not in found and len(families) == 1:
            family_desc, size = families[0]
            rows = positions.filter((pl.col("group_desc") == family_desc) & (pl.col("size") == size))
            found[dim] = rows.select("rank", "pos")
    return found


def _families(groups: pl.DataFrame, desc: pl.Expr):
    """((desc, size), [members, ...]) for every set of groups sharing a desc and a size."""
    table = (
        groups.filter(~desc.is_in(list(DIMS)) & pl.col("group_desc").is_not_null())
        .group_by("group_desc", "size", maintain_order=True)
        .agg(pl.col("members"))
    )
    for family_desc, size, members in table.iter_rows():
        yield (family_desc, size), members


def _covers(members: list[list[int]], world: int) -> bool:
    """Pairwise disjoint groups whose union is every rank."""
    flat = [r for group in members for r in group]
    return len(flat) == world and set(flat) == set(range(world))


def _ranks(ev: pl.DataFrame, coords: dict[str, pl.DataFrame], meta: dict, world: int) -> pl.DataFrame:
    nodes = {int(k): v for k, v in (meta.get("nodes") or {}).items()}
    host = meta.get("hostname") or "localhost"
    per_rank = ev.group_by("rank").agg(
        n_events=pl.len().cast(pl.Int64),
        n_ends=((pl.col("kind") == schemas.KIND_MARKER) & (pl.col("op") == "iteration_end")).sum(),
        max_iteration=pl.col("iteration").max(),
    )
    ranks = pl.DataFrame(
        {"rank": list(range(world)), "node": [nodes.get(r, host) for r in range(world)]},
        schema={"rank": pl.Int32, "node": pl.String},
    ).join(per_rank, on="rank", how="left")
    for dim in DIMS:
        if dim in coords:
            ranks = ranks.join(coords[dim].rename({"pos": dim}), on="rank", how="left")
        else:
            ranks = ranks.with_columns(pl.lit(None, pl.Int32).alias(dim))
    rules = meta.get("boundaries") or {}
    found = pl.col("n_ends").fill_null(0) > 0
    return ranks.with_columns(
        [pl.col(dim).fill_null(-1) for dim in DIMS],
        n_events=pl.col("n_events").fill_null(0),
        iterations=pl.when(found).then(pl.col("n_ends")).otherwise(pl.col("max_iteration").fill_null(-1) + 1),
        iteration_rule=pl.when(found).then(pl.lit(rules.get("iteration", "optimizer step")))
        .otherwise(pl.lit(NO_BOUNDARY)),
        microbatch_rule=pl.lit(rules.get("microbatch", "outermost module forward")),
    ).sort("rank")


NO_BOUNDARY = "none found (events.iteration)"


def check_iterations(ranks: pl.DataFrame, meta: dict) -> None:
    """Every rank ends the same number of iterations, by the same rule; a named function ran on every rank."""
    rule = (meta.get("boundaries") or {}).get("iteration", "")
    if rule.startswith("function "):
        missing = ranks.filter(pl.col("iteration_rule") == NO_BOUNDARY)["rank"].to_list()
        if missing:
            raise GraphError(f"rank{'s' if len(missing) > 1 else ''} {ranks_str(missing)}: the iteration boundary "
                             f"{rule} never returned (no iteration_end marker); name a function every rank calls "
                             "once an iteration (prism launch --iteration-fn MODULE:QUALNAME)")
    counts = ranks.group_by("iterations", "iteration_rule", maintain_order=True).agg(pl.col("rank").sort())
    if counts.height > 1:
        parts = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {ranks_str(rs)}: {n} ({why})"
                          for n, why, rs in counts.sort("iterations").iter_rows())
        raise GraphError(f"ranks disagree on the number of iterations: {parts}. Every rank must end the same "
                         "iterations; where the default rule does not fit the program, name the function one "
                         "iteration calls once (prism launch --iteration-fn MODULE:QUALNAME, or the job config's "
                         "workload.iteration_fn)")


# ------------------------------------------------------------------------------------------------ stage


def _to_arrow(df: pl.DataFrame) -> pa.Table:
    return df.to_arrow(compat_level=pl.CompatLevel.oldest())


def build_graph(raw_dir: str | Path) -> dict[str, pa.Table]:
    """The graph tables (``events``, ``comms``, ``groups``, ``ranks``) of the raw streams in `raw_dir`.

    Pure: reads `raw_dir`, writes nothing. Raises `GraphError` (one line naming the file, rank and event)
    when the streams are missing, truncated or inconsistent.
    """
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise GraphError(
            f"{raw_dir}: no raw streams (missing folder); run the capture first "
            "(`prism launch --mode capture --out JOB ...`, or `make demo`)"
        )
    meta = job_files.read_meta_file(job_files.raw_meta(raw_dir))
    world = meta["world_size"]
    raw_events, raw_groups = _read_ranks(_rank_dirs(raw_dir, world))
    ev = pl.from_arrow(raw_events)
    groups = _merge_groups(pl.from_arrow(raw_groups))
    positions = _member_positions(groups)

    check_comm_events(ev, positions, world)
    coll = match_collectives(ev, positions, groups)
    p2p = match_p2p(ev)
    waits = wait_targets(ev)

    columns = [f.name for f in schemas.COMMS if f.name != "comm_id"]
    comms = (
        pl.concat(
            [coll.select(*columns, "first_event"), p2p.select(*columns, "first_event")], how="vertical_relaxed"
        )
        .sort("t_first_start_ns", "first_event")
        .with_columns(comm_id=pl.int_range(pl.len(), dtype=pl.Int64))
    )
    event_comm = comms.select("comm_id", event_id="event_ids").explode("event_id")
    links = (
        ev.select("event_id")
        .join(event_comm, on="event_id", how="left")
        .join(waits, on="event_id", how="left")
        .sort("event_id")
        .select(pl.col("comm_id").fill_null(-1), pl.col("op_event_id").fill_null(-1))
    )
    events = raw_events.append_column("comm_id", links["comm_id"].to_arrow()).append_column(
        "op_event_id", links["op_event_id"].to_arrow()
    )
    ranks = _ranks(ev, _coordinates(groups, positions, world), meta, world)
    check_iterations(ranks, meta)
    return {
        "events": events,
        "comms": _to_arrow(comms.drop("first_event")),
        "groups": _to_arrow(groups.select([f.name for f in schemas.GROUPS])),
        "ranks": _to_arrow(ranks.select([f.name for f in schemas.RANKS])),
    }


def default_raw_dir(job: Path) -> Path:
    """``JOB/raw``, or ``JOB/capture/raw`` when only that exists."""
    raw, captured = job_files.raw_dir(job), job_files.raw_dir(job_files.capture_dir(job))
    if not raw.exists() and captured.exists():
        return captured
    return raw


@folder_lock.locks_job("prism graph")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism graph", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>)")
    parser.add_argument("--raw", type=Path, help="raw streams folder (default: JOB/raw)")
    parser.add_argument("--out", type=Path, help="output folder (default: JOB/graph)")
    args = parser.parse_args(argv)
    raw_dir = args.raw or default_raw_dir(args.job)
    out = args.out or job_files.graph_dir(args.job)
    try:
        tables = build_graph(raw_dir)
        write_outputs(out, tables, run_id=same_run([raw_dir]))  # the graph carries the capture's run id
    except ArtifactError as exc:
        print(f"prism graph: error: {exc}", file=sys.stderr)
        return 2
    comms = tables["comms"]
    n_p2p = sum(1 for kind in comms["kind"].to_pylist() if kind == "p2p")
    print(
        f"prism graph: {tables['ranks'].num_rows} ranks, {tables['events'].num_rows} events, "
        f"{comms.num_rows - n_p2p} collectives, {n_p2p} p2p, {tables['groups'].num_rows} groups -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
