"""The graph stage: merge every rank's raw stream into the bare graph of the job.

``python -m prism.graph --job DIR`` reads ``DIR/raw/rank=R/{events,groups}.arrow`` and ``DIR/raw/meta.json``
and writes ``DIR/graph/{events,comms,groups,ranks}.parquet`` (all or none). `build_graph` is the pure
function behind it. What it makes explicit:

- comm matching: a collective instance is the events of every member of its group at one (group,
  group_seq); the k-th send from a to b with tag t pairs with the k-th recv on b from a with tag t;
- async op -> wait: ``events.op_event_id`` of a wait is the event of the op with the same work_id;
- rank coordinates: for a group whose desc is tp/pp/dp/ep the coordinate is the rank's index in it.
  Without such descs (DeviceMesh, DDP), a family of groups with one desc, one size, pairwise disjoint
  and covering every rank is one dimension; it is named tp/pp/dp/ep when its desc contains exactly one
  of those words (``mesh_tp``, ``dp_shard``). Coordinates nothing names (DDP's lone ``default_pg``, or
  two families claiming one name) stay -1.
- ``ranks.iterations``: the number of ``iteration_end`` markers, or max(iteration) + 1 without markers.

Every inconsistency (a collective some members never issued, an unmatched send or recv, a wait on an
unknown op, ranks disagreeing on an op) is one `GraphError` naming the rank, event and group.
"""

from __future__ import annotations

import argparse
import os
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from prism import schemas
from prism.artifacts import ArtifactError, read_raw_stream, same_run, write_outputs

DIMS = ("tp", "pp", "dp", "ep")
# Collectives whose members all contribute the same number of bytes (op names compared without "_").
_EQUAL_SIZE_OPS = {
    "allreduce", "allreducecoalesced", "broadcast", "reduce", "allgather", "allgatherbase",
    "allgathersingle", "allgatherintotensor", "allgatherintotensorcoalesced", "reducescatter",
    "reducescatterbase", "reducescattersingle", "reducescattertensor", "reducescattertensorcoalesced",
}
_DIM_WORD = re.compile(r"(?<![a-z0-9])(tp|pp|dp|ep)(?![a-z0-9])")


class GraphError(ArtifactError):
    """The raw streams do not form a consistent job graph."""


# ---------------------------------------------------------------------------------------------- reading


def _read_meta(raw_dir: Path) -> dict:
    path = raw_dir / "meta.json"
    if not path.is_file():
        raise GraphError(f"{path}: missing (the capture did not finish writing the job's metadata)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GraphError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(meta.get("world_size"), int) or meta["world_size"] < 1:
        raise GraphError(f"{path}: world_size must be a positive integer, got {meta.get('world_size')!r}")
    version = str(meta.get("schema_version", schemas.SCHEMA_VERSION))
    if version != schemas.SCHEMA_VERSION:
        raise GraphError(
            f"{path}: schema_version {version!r}, this prism reads {schemas.SCHEMA_VERSION!r}; "
            "re-run the capture with this prism"
        )
    return meta


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
            f"{raw_dir}: ranks {_ranks_str(missing)} missing ({expected}); "
            "the capture was interrupted or those ranks crashed: see their logs"
        )
    if extra:
        raise GraphError(
            f"{raw_dir}: unexpected ranks {_ranks_str(extra)} ({expected}); "
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
        return (_decode(read_raw_stream(d / "events.arrow", schemas.RAW_EVENTS)),
                read_raw_stream(d / "groups.arrow", schemas.RAW_GROUPS))

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
            f"{rank_dirs[rank] / 'events.arrow'}: row {row - starts[row]} has seq {seq[row]}, expected "
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
                f"{rank_dirs[rank] / 'events.arrow'}: event seq {seq} of rank {rank} ({table.column('kind')[row]} "
                f"{table.column('op')[row]}) has a negative duration ({name}); {len(rows)} such events: the "
                "recorder that wrote it is broken (re-record with this prism)"
            )


def _ranks_str(ranks) -> str:
    """[0, 1, 2, 5] -> "[0-2, 5]": short enough for a one-line message even with 1024 ranks."""
    ranks = sorted(ranks)
    runs: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        runs += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i : j + 1]]
        i = j + 1
    return "[" + ", ".join(runs) + "]"


def _members_str(members: list[int]) -> str:
    """A group's members in group order (ring order matters), abbreviated when long."""
    if len(members) <= 16:
        return "[" + ", ".join(map(str, members)) + "]"
    if members == sorted(members):
        return _ranks_str(members)
    return "[" + ", ".join(map(str, members[:8])) + f", ... ({len(members)} ranks)]"


# ----------------------------------------------------------------------------------------------- groups


def _merge_groups(raw_groups: pl.DataFrame) -> pl.DataFrame:
    keyed = raw_groups.with_columns(
        key=pl.col("members").list.eval(pl.element().cast(pl.String)).list.join(",")
    )
    conflicts = (
        keyed.group_by("group", maintain_order=True).agg(pl.col("key").n_unique()).filter(pl.col("key") > 1)
    )
    if conflicts.height:
        name = conflicts["group"][0]
        rows = keyed.filter(pl.col("group") == name).unique("key", keep="first", maintain_order=True)
        a, b = rows.row(0, named=True), rows.row(1, named=True)
        raise GraphError(
            f"group {name!r}: rank {a['rank']} has members {a['members']}, rank {b['rank']} has "
            f"{b['members']}; a group name must mean one set of ranks across the job"
        )
    groups = (
        keyed.group_by("group", maintain_order=True)
        .agg(
            pl.col("desc").drop_nulls().first(),
            pl.col("members").first(),
            pl.col("backend").first(),
        )
        .with_columns(size=pl.col("members").list.len().cast(pl.Int32))
    )
    dup = groups.filter(pl.col("members").list.n_unique() != pl.col("size"))
    if dup.height:
        raise GraphError(f"group {dup['group'][0]!r}: members {dup['members'][0]} repeat a rank")
    return groups.with_columns(ring=pl.col("members"))


def _member_positions(groups: pl.DataFrame) -> pl.DataFrame:
    """(group, rank, pos): every member's index in its group."""
    return (
        groups.select("group", "desc", "size", rank=pl.col("members"))
        .with_columns(pos=pl.int_ranges(0, pl.col("rank").list.len()))
        .explode(["rank", "pos"])
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("pos").cast(pl.Int32))
    )


# ---------------------------------------------------------------------------------------- collectives


def _where(e: dict) -> str:
    return f"rank {e['rank']} event seq {e['seq']} (iteration {e['iteration']})"


def _check_comm_events(ev: pl.DataFrame, positions: pl.DataFrame, world: int) -> None:
    comm = ev.filter(pl.col("kind").is_in(list(schemas.COMM_KINDS)))
    coll = comm.filter(pl.col("kind") == schemas.KIND_COLLECTIVE)
    no_group = coll.filter(pl.col("group").is_null() | (pl.col("group_seq") < 0))
    if no_group.height:
        e = no_group.row(0, named=True)
        raise GraphError(f"{_where(e)}: collective {e['op']} has no group or no group_seq; recorder bug")
    known = comm.filter(pl.col("group").is_not_null()).join(
        positions.select("group", "rank", "pos"), on=["group", "rank"], how="left"
    )
    unknown = known.filter(pl.col("pos").is_null())
    if unknown.height:
        e = unknown.row(0, named=True)
        raise GraphError(
            f"{_where(e)}: {e['op']} on group {e['group']!r}, which is not a group of rank {e['rank']} "
            "in any groups.arrow; the rank's group list is incomplete"
        )
    p2p = comm.filter(pl.col("kind") != schemas.KIND_COLLECTIVE)
    bad_peer = p2p.filter((pl.col("peer") < 0) | (pl.col("peer") >= world))
    if bad_peer.height:
        e = bad_peer.row(0, named=True)
        if e["op"] == schemas.OP_RECV_ANYSOURCE and e["peer"] == -1:
            raise GraphError(
                f"{_where(e)}: recv from any source whose sender was never recorded: the program never "
                "waited on it (or an older prism recorded it); wait on every recv, and capture again"
            )
        raise GraphError(f"{_where(e)}: {e['kind']} with peer {e['peer']}, outside 0..{world - 1}")


def _collectives(ev: pl.DataFrame, positions: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    coll = ev.filter(pl.col("kind") == schemas.KIND_COLLECTIVE).join(
        positions.select("group", "rank", "pos"), on=["group", "rank"], how="left"
    )
    dup = coll.group_by("group", "group_seq", "rank").agg(pl.col("seq")).filter(pl.col("seq").list.len() > 1)
    if dup.height:
        d = dup.row(0, named=True)
        raise GraphError(
            f"rank {d['rank']} events seq {d['seq']}: several collectives with group_seq {d['group_seq']} "
            f"on group {d['group']!r}; recorder bug"
        )
    inst = (
        coll.sort("group", "group_seq", "pos")
        .group_by("group", "group_seq", maintain_order=True)
        .agg(
            op=pl.col("op").first(),
            n_ops=pl.col("op").n_unique(),
            n_roots=pl.col("peer").n_unique(),
            n_sizes=pl.col("bytes").n_unique(),
            n_dtypes=pl.col("dtype").drop_nulls().n_unique(),
            src=pl.col("peer").first(),
            tag=pl.col("tag").first(),
            n_members=pl.len().cast(pl.Int32),
            bytes=pl.col("bytes").sum(),
            members=pl.col("rank"),
            event_ids=pl.col("event_id"),
            iteration=pl.col("iteration").min(),
            t_first_start_ns=pl.col("t_start_ns").min(),
            t_last_start_ns=pl.col("t_start_ns").max(),
            t_last_end_ns=pl.col("t_end_ns").max(),
            first_event=pl.col("event_id").min(),
        )
        .join(groups.select("group", "desc", "size", group_members="members"), on="group", how="left")
        .with_columns(
            equal_size=pl.col("op").str.replace_all("_", "").str.to_lowercase().is_in(list(_EQUAL_SIZE_OPS))
        )
    )
    bad = inst.filter(
        (pl.col("n_members") != pl.col("size"))
        | (pl.col("n_ops") > 1)
        | (pl.col("n_roots") > 1)
        | (pl.col("n_dtypes") > 1)
        | (pl.col("equal_size") & (pl.col("n_sizes") > 1))
    ).sort("group_seq", "first_event")
    if bad.height:
        _raise_collective(bad.row(0, named=True), coll, ev)
    return inst.with_columns(
        kind=pl.lit("collective"),
        dst=pl.lit(-1, pl.Int32),
        src=pl.when(pl.col("src") >= 0).then(pl.col("src")).otherwise(-1),
        tag=pl.lit(-1, pl.Int32),
    )


def _split_by(rows: pl.DataFrame, column: str, unit: str = "") -> str:
    parts = rows.group_by(column, maintain_order=True).agg(pl.col("rank"))
    return "; ".join(f"{value}{unit} on ranks {_ranks_str(ranks)}" for value, ranks in parts.iter_rows())


def _raise_collective(i: dict, coll: pl.DataFrame, ev: pl.DataFrame) -> None:
    desc = f" ({i['desc']})" if i["desc"] else ""
    name = f"{i['op']} #{i['group_seq']} on group {i['group']!r}{desc} {_members_str(i['group_members'])}"
    rows = coll.filter((pl.col("group") == i["group"]) & (pl.col("group_seq") == i["group_seq"]))
    first = rows.sort("event_id").row(0, named=True)
    if i["n_members"] != i["size"]:
        absent = sorted(set(i["group_members"]) - set(i["members"]))
        issued = (
            ev.filter((pl.col("kind") == schemas.KIND_COLLECTIVE) & (pl.col("group") == i["group"]))
            .group_by("rank")
            .len()
        )
        counts = dict(issued.iter_rows())
        raise GraphError(
            f"collective {name}: issued by ranks {_ranks_str(i['members'])} (first at {_where(first)}) "
            f"but not by {_ranks_str(absent)} (rank {absent[0]} issued {counts.get(absent[0], 0)} "
            "collectives on this group); a rank stopped early or took another code path"
        )
    if i["n_ops"] > 1:
        raise GraphError(
            f"collective #{i['group_seq']} on group {i['group']!r}{desc} {_members_str(i['group_members'])}: "
            f"ranks issued different ops ({_split_by(rows, 'op')}) at {_where(first)}; "
            "the ranks issue collectives on this group in different orders"
        )
    if i["n_roots"] > 1:
        raise GraphError(f"collective {name}: ranks disagree on the root ({_split_by(rows, 'peer')})")
    if i["n_dtypes"] > 1:
        raise GraphError(f"collective {name}: ranks disagree on the dtype ({_split_by(rows, 'dtype')})")
    raise GraphError(
        f"collective {name}: members contribute different sizes ({_split_by(rows, 'bytes', ' bytes')}) "
        f"at {_where(first)}; the tensors' shapes differ between ranks"
    )


# ------------------------------------------------------------------------------------------------- p2p


def _p2p(ev: pl.DataFrame) -> pl.DataFrame:
    cols = ["event_id", "rank", "seq", "op", "bytes", "iteration", "t_start_ns", "t_end_ns"]
    # messages on different groups are different channels, even between the same ranks with the same tag
    key = ["group", "src", "dst", "tag"]
    sends = (
        ev.filter(pl.col("kind") == schemas.KIND_SEND)
        .select(*cols, "group", "tag", src=pl.col("rank"), dst=pl.col("peer"))
        .with_columns(k=pl.int_range(pl.len()).over(key))
    )
    recvs = (
        ev.filter(pl.col("kind") == schemas.KIND_RECV)
        .select(*cols, "group", "tag", src=pl.col("peer"), dst=pl.col("rank"))
        .with_columns(k=pl.int_range(pl.len()).over(key))
    )
    pairs = sends.join(recvs, on=[*key, "k"], how="full", coalesce=True, suffix="_r")
    lonely = pairs.filter(pl.col("event_id").is_null() | pl.col("event_id_r").is_null())
    if lonely.height:
        first = lonely.with_columns(
            first=pl.coalesce("event_id", "event_id_r"), it=pl.coalesce("iteration", "iteration_r")
        ).sort("it", "first")
        _raise_unmatched(first.row(0, named=True), sends, recvs)
    sizes = pairs.filter(
        (pl.col("bytes") > 0) & (pl.col("bytes_r") > 0) & (pl.col("bytes") != pl.col("bytes_r"))
    )
    if sizes.height:
        p = sizes.sort("event_id").row(0, named=True)
        raise GraphError(
            f"{_where(p)}: send to rank {p['dst']} (tag {p['tag']}) has {p['bytes']} bytes, the matching recv "
            f"on rank {p['dst']} (seq {p['seq_r']}) expects {p['bytes_r']}; the tensors' shapes differ"
        )
    return pairs.select(
        "op",
        "group",
        "src",
        "dst",
        "tag",
        "bytes",
        kind=pl.lit("p2p"),
        group_seq=pl.lit(-1, pl.Int64),
        n_members=pl.lit(2, pl.Int32),
        members=pl.concat_list("src", "dst"),
        event_ids=pl.concat_list("event_id", "event_id_r"),
        iteration=pl.min_horizontal("iteration", "iteration_r"),
        t_first_start_ns=pl.min_horizontal("t_start_ns", "t_start_ns_r"),
        t_last_start_ns=pl.max_horizontal("t_start_ns", "t_start_ns_r"),
        t_last_end_ns=pl.max_horizontal("t_end_ns", "t_end_ns_r"),
        first_event=pl.min_horizontal("event_id", "event_id_r"),
    )


def _raise_unmatched(p: dict, sends: pl.DataFrame, recvs: pl.DataFrame) -> None:
    same = (
        (pl.col("group") == p["group"]) & (pl.col("src") == p["src"]) & (pl.col("dst") == p["dst"])
        & (pl.col("tag") == p["tag"])
    )
    on = f"group {p['group']!r}"
    if p["event_id"] is not None:
        raise GraphError(
            f"{_where(p)}: send #{p['k']} from rank {p['src']} to rank {p['dst']} with tag {p['tag']} on {on} "
            f"has no matching recv (rank {p['dst']} posted {recvs.filter(same).height} recvs from rank "
            f"{p['src']} with that tag on that group); the receiver stopped early or used another tag, peer "
            "or group"
        )
    e = {"rank": p["rank_r"], "seq": p["seq_r"], "iteration": p["iteration_r"]}
    raise GraphError(
        f"{_where(e)}: recv #{p['k']} on rank {p['dst']} from rank {p['src']} with tag {p['tag']} on {on} "
        f"has no matching send (rank {p['src']} sent {sends.filter(same).height} with that tag on that "
        "group); the sender stopped early or used another tag, peer or group"
    )


# ----------------------------------------------------------------------------------------------- waits


def _wait_targets(ev: pl.DataFrame) -> pl.DataFrame:
    """(event_id of each wait, op_event_id of the op it waits on)."""
    ops = ev.filter(pl.col("kind").is_in(list(schemas.COMM_KINDS)) & (pl.col("work_id") >= 0)).select(
        "rank", "work_id", op_event_id="event_id", op_seq="seq"
    )
    dup = ops.group_by("rank", "work_id").agg(pl.col("op_seq")).filter(pl.col("op_seq").list.len() > 1)
    if dup.height:
        d = dup.row(0, named=True)
        raise GraphError(
            f"rank {d['rank']} events seq {d['op_seq']}: several ops with work_id {d['work_id']}; recorder bug"
        )
    waits = ev.filter(pl.col("kind") == schemas.KIND_WAIT).join(ops, on=["rank", "work_id"], how="left")
    bad = waits.filter(pl.col("op_event_id").is_null() | (pl.col("op_seq") > pl.col("seq")))
    if bad.height:
        w = bad.row(0, named=True)
        why = (
            "no op with that work_id on this rank (the stream lost the op, or the recorder mislinked it)"
            if w["op_event_id"] is None
            else f"the op with that work_id comes later, at seq {w['op_seq']}"
        )
        raise GraphError(f"{_where(w)}: wait on work_id {w['work_id']}, but {why}")
    return waits.select("event_id", "op_event_id")


# ----------------------------------------------------------------------------------------------- ranks


def _coordinates(groups: pl.DataFrame, positions: pl.DataFrame, world: int) -> dict[str, pl.DataFrame]:
    """dim -> (rank, pos) for every dimension the groups name."""
    desc = pl.col("desc").fill_null("").str.to_lowercase()
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
            rows = positions.filter((pl.col("desc") == family_desc) & (pl.col("size") == size))
            found[dim] = rows.select("rank", "pos")
    return found


def _families(groups: pl.DataFrame, desc: pl.Expr):
    """((desc, size), [members, ...]) for every set of groups sharing a desc and a size."""
    table = (
        groups.filter(~desc.is_in(list(DIMS)) & pl.col("desc").is_not_null())
        .group_by("desc", "size", maintain_order=True)
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
    return ranks.with_columns(
        [pl.col(dim).fill_null(-1) for dim in DIMS],
        n_events=pl.col("n_events").fill_null(0),
        iterations=pl.when(pl.col("n_ends") > 0)
        .then(pl.col("n_ends"))
        .otherwise(pl.col("max_iteration").fill_null(-1) + 1),
    ).sort("rank")


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
    meta = _read_meta(raw_dir)
    world = meta["world_size"]
    raw_events, raw_groups = _read_ranks(_rank_dirs(raw_dir, world))
    ev = pl.from_arrow(raw_events)
    groups = _merge_groups(pl.from_arrow(raw_groups))
    positions = _member_positions(groups)

    _check_comm_events(ev, positions, world)
    coll = _collectives(ev, positions, groups)
    p2p = _p2p(ev)
    waits = _wait_targets(ev)

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
    return {
        "events": events,
        "comms": _to_arrow(comms.drop("first_event")),
        "groups": _to_arrow(groups.select([f.name for f in schemas.GROUPS])),
        "ranks": _to_arrow(ranks.select([f.name for f in schemas.RANKS])),
    }


def default_raw_dir(job: Path) -> Path:
    """``JOB/raw``, or ``JOB/capture/raw`` when only that exists."""
    raw = job / "raw"
    if not raw.exists() and (job / "capture" / "raw").exists():
        return job / "capture" / "raw"
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.graph", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>)")
    parser.add_argument("--raw", type=Path, help="raw streams folder (default: JOB/raw)")
    parser.add_argument("--out", type=Path, help="output folder (default: JOB/graph)")
    args = parser.parse_args(argv)
    raw_dir = args.raw or default_raw_dir(args.job)
    out = args.out or args.job / "graph"
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
