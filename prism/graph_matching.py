"""Matching of a job's communications across its ranks, for the graph stage (`prism.graph`).

- a collective instance is the events of every member of its group at one (group, group_seq); members
  must agree on op, size (where all contribute equally) and root;
- the k-th send from a to b with tag t pairs with the k-th recv on b from a with tag t (a recv from any
  source takes the sender it recorded);
- a wait points at the op with its work_id.

Every inconsistency is one `GraphError` naming the rank, event and group (messages abbreviate long rank
lists: `ranks_str`).
"""

from __future__ import annotations

import polars as pl

from prism import schemas
from prism.artifacts import ArtifactError

# Collectives whose members all contribute the same number of bytes (op names compared without "_").
_EQUAL_SIZE_OPS = {
    "allreduce", "allreducecoalesced", "broadcast", "reduce", "allgather", "allgatherbase",
    "allgathersingle", "allgatherintotensor", "allgatherintotensorcoalesced", "reducescatter",
    "reducescatterbase", "reducescattersingle", "reducescattertensor", "reducescattertensorcoalesced",
}


class GraphError(ArtifactError):
    """The raw streams do not form a consistent job graph."""


def ranks_str(ranks) -> str:
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
        return ranks_str(members)
    return "[" + ", ".join(map(str, members[:8])) + f", ... ({len(members)} ranks)]"


# ---------------------------------------------------------------------------------------- collectives


def _where(e: dict) -> str:
    return f"rank {e['rank']} event seq {e['seq']} (iteration {e['iteration']})"


def check_comm_events(ev: pl.DataFrame, positions: pl.DataFrame, world: int) -> None:
    comm = ev.filter(pl.col("kind").is_in(list(schemas.COMM_KINDS)))
    coll = comm.filter(pl.col("kind") == schemas.KIND_COLLECTIVE)
    no_group = coll.filter(pl.col("group_name").is_null() | (pl.col("group_seq") < 0))
    if no_group.height:
        e = no_group.row(0, named=True)
        raise GraphError(f"{_where(e)}: collective {e['op']} has no group or no group_seq; recorder bug")
    known = comm.filter(pl.col("group_name").is_not_null()).join(
        positions.select("group_name", "rank", "pos"), on=["group_name", "rank"], how="left"
    )
    unknown = known.filter(pl.col("pos").is_null())
    if unknown.height:
        e = unknown.row(0, named=True)
        raise GraphError(
            f"{_where(e)}: {e['op']} on group {e['group_name']!r}, which is not a group of rank {e['rank']} "
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


def match_collectives(ev: pl.DataFrame, positions: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    coll = ev.filter(pl.col("kind") == schemas.KIND_COLLECTIVE).join(
        positions.select("group_name", "rank", "pos"), on=["group_name", "rank"], how="left"
    )
    dup = coll.group_by("group_name", "group_seq", "rank").agg(pl.col("seq")).filter(pl.col("seq").list.len() > 1)
    if dup.height:
        d = dup.row(0, named=True)
        raise GraphError(
            f"rank {d['rank']} events seq {d['seq']}: several collectives with group_seq {d['group_seq']} "
            f"on group {d['group_name']!r}; recorder bug"
        )
    inst = (
        coll.sort("group_name", "group_seq", "pos")
        .group_by("group_name", "group_seq", maintain_order=True)
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
        .join(groups.select("group_name", "group_desc", "size", group_members="members"), on="group_name", how="left")
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
    return "; ".join(f"{value}{unit} on ranks {ranks_str(ranks)}" for value, ranks in parts.iter_rows())


def _raise_collective(i: dict, coll: pl.DataFrame, ev: pl.DataFrame) -> None:
    desc = f" ({i['group_desc']})" if i["group_desc"] else ""
    name = f"{i['op']} #{i['group_seq']} on group {i['group_name']!r}{desc} {_members_str(i['group_members'])}"
    rows = coll.filter((pl.col("group_name") == i["group_name"]) & (pl.col("group_seq") == i["group_seq"]))
    first = rows.sort("event_id").row(0, named=True)
    if i["n_members"] != i["size"]:
        absent = sorted(set(i["group_members"]) - set(i["members"]))
        issued = (
            ev.filter((pl.col("kind") == schemas.KIND_COLLECTIVE) & (pl.col("group_name") == i["group_name"]))
            .group_by("rank")
            .len()
        )
        counts = dict(issued.iter_rows())
        raise GraphError(
            f"collective {name}: issued by ranks {ranks_str(i['members'])} (first at {_where(first)}) "
            f"but not by {ranks_str(absent)} (rank {absent[0]} issued {counts.get(absent[0], 0)} "
            "collectives on this group); a rank stopped early or took another code path"
        )
    if i["n_ops"] > 1:
        raise GraphError(
            f"collective #{i['group_seq']} on group {i['group_name']!r}{desc} {_members_str(i['group_members'])}: "
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


def match_p2p(ev: pl.DataFrame) -> pl.DataFrame:
    cols = ["event_id", "rank", "seq", "op", "bytes", "iteration", "t_start_ns", "t_end_ns"]
    # messages on different groups are different channels, even between the same ranks with the same tag
    key = ["group_name", "src", "dst", "tag"]
    sends = (
        ev.filter(pl.col("kind") == schemas.KIND_SEND)
        .select(*cols, "group_name", "tag", src=pl.col("rank"), dst=pl.col("peer"))
        .with_columns(k=pl.int_range(pl.len()).over(key))
    )
    recvs = (
        ev.filter(pl.col("kind") == schemas.KIND_RECV)
        .select(*cols, "group_name", "tag", src=pl.col("peer"), dst=pl.col("rank"))
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
        "group_name",
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
        (pl.col("group_name") == p["group_name"]) & (pl.col("src") == p["src"]) & (pl.col("dst") == p["dst"])
        & (pl.col("tag") == p["tag"])
    )
    on = f"group {p['group_name']!r}"
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


def wait_targets(ev: pl.DataFrame) -> pl.DataFrame:
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
