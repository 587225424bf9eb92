"""Slice planner: split the W ranks into slices of at most P ranks that run for real together.

    prism slices plan --job DIR --devices P [--representative] [--rule sync-first|bytes]
                      [--keep-whole DESC[,DESC...]]
        ->  DIR/slices/plan.parquet

Ranks that wait on each other stay together first, then those that exchange the most bytes (`--rule
sync-first`, the default): every pair of ranks gets, from the comms of groups small enough to fit in a slice
(a TP group, then EP, ...) and from point-to-point messages, (a) how many *synchronous* comms it shares, a comm
being synchronous when one of the two ranks waits on it at once (its event is not asynchronous: nothing of the
rank ran between its issue and its wait), and (b) the bytes they exchange; clusters are merged greedily along the
pairs in that order (most synchronous comms, then most bytes) while they fit in P, then packed into as few slices
as possible. The reason (issue 24, docs/fidelity.md "Session 18" and "Session 19"): a comm whose members are in
different slices crosses the replay server, whose service differs from the job's; on a synchronous comm that
difference is on the rank's path at every op, on an asynchronous one (the data-parallel gradient buckets,
overlapped with the backward) it is mostly hidden. The bytes rule alone (`--rule bytes`) split every TP group of
tp2dp4 and tp4dp2 (a DP+EDP pair's bytes above a TP pair's): -26..-35 % on tp4dp2. `--keep-whole tp` first puts
every group whose description (`group_desc`, e.g. tp, ep) is named in one slice (each group that fits in P),
then merges by the rule: the user's say over the rule's.

Equivalent ranks: two ranks do the same work when they sit at the same PP stage and issue the same
sequence of operations (kind, op, bytes); the bytes of a collective whose members contribute different
sizes (an all-to-all whose splits follow the data, as an MoE's token routing) are left out, since they
differ between any two EP groups' ranks and would make every rank its own class (at W=1024 on P=16 no two
slices were equivalent, docs/benchmarks.md). A rank's class in a slice adds its place there: for every
group it communicates in, the group's description (`group_desc`), size and how many of its members are in the
slice, and how many of its point-to-point peers are (what ran for real beside it, what was replayed). With
`--representative`, only one slice per class of equivalent slices (same multiset of rank classes) is
measured; every other slice takes its measurement (`measured_by`), and the saving is reported. The number
of measured slices follows the layout's distinct places, not W (tests/unit/test_slice_classes.py).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import defaultdict
from pathlib import Path

import polars as pl
import pyarrow as pa

from prism import folder_lock
from prism import artifacts, schemas
from prism import job as job_files


class PlanError(Exception):
    pass


RULES = ("sync-first", "bytes")


def _pair_weights(comms: pl.DataFrame, p: int) -> dict[tuple[int, int], float]:
    """Bytes a pair of ranks exchanges in comms of at most `p` members (a collective's bytes shared out over
    its n - 1 partners)."""
    weights: dict[tuple[int, int], float] = defaultdict(float)
    for members, nbytes in zip(comms["members"].to_list(), comms["bytes"].to_list()):
        n = len(members)
        if n < 2 or n > p:
            continue
        share = nbytes / (n - 1)
        for i in range(n):
            for j in range(i + 1, n):
                a, b = sorted((members[i], members[j]))
                weights[(a, b)] += share
    return weights


def _sync_counts(events: pl.DataFrame, comms: pl.DataFrame, p: int) -> dict[tuple[int, int], int]:
    """Per pair of ranks, the comms of at most `p` members they share in which one of the two waits at once
    (its event of the comm is not asynchronous)."""
    waits = (events.filter(pl.col("comm_id") >= 0).filter(~pl.col("is_async"))
             .group_by("comm_id").agg(pl.col("rank").unique()))
    waiting = dict(zip(waits["comm_id"].to_list(), (set(r) for r in waits["rank"].to_list())))
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for cid, members in zip(comms["comm_id"].to_list(), comms["members"].to_list()):
        sync = waiting.get(cid)
        n = len(members)
        if not sync or n < 2 or n > p:
            continue
        for i in range(n):
            for j in range(i + 1, n):
                if members[i] in sync or members[j] in sync:
                    counts[tuple(sorted((members[i], members[j])))] += 1
    return counts


def pair_order(events: pl.DataFrame, comms: pl.DataFrame, p: int, rule: str) -> dict[tuple[int, int], tuple]:
    """Each pair's merge key under `rule` (larger first): ("sync-first") its synchronous comms, then its bytes;
    ("bytes") its bytes."""
    if rule not in RULES:
        raise PlanError(f"--rule {rule}: unknown; use one of {', '.join(RULES)}")
    nbytes = _pair_weights(comms, p)
    if rule == "bytes":
        return {pair: (w,) for pair, w in nbytes.items()}
    sync = _sync_counts(events, comms, p)
    return {pair: (sync.get(pair, 0), nbytes.get(pair, 0.0)) for pair in nbytes.keys() | sync.keys()}


def cluster(world: int, p: int, weights: dict[tuple[int, int], float | tuple],
            whole: list[list[int]] = ()) -> list[list[int]]:
    """Greedy agglomeration along the heaviest pairs (a weight: a number, or a tuple compared in order), clusters
    of at most `p` ranks, then packing; the groups of `whole` (member lists) are merged first, each while it fits
    in `p`."""
    parent = list(range(world))
    size = [1] * world

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    kept = [(a, b) for members in whole for a, b in zip(members, members[1:])]
    # the groups kept whole first, then the heaviest pair; ties broken by rank numbers so plans are deterministic
    for (a, b) in kept + [pair for pair, _w in sorted(weights.items(), key=_heaviest_first)]:
        ra, rb = find(a), find(b)
        if ra != rb and size[ra] + size[rb] <= p:
            parent[rb] = ra
            size[ra] += size[rb]
    groups: dict[int, list[int]] = defaultdict(list)
    for r in range(world):
        groups[find(r)].append(r)
    clusters = sorted(groups.values(), key=lambda c: (-len(c), c[0]))
    slices: list[list[int]] = []
    for c in clusters:  # first fit decreasing
        for s in slices:
            if len(s) + len(c) <= p:
                s.extend(c)
                break
        else:
            slices.append(list(c))
    return [sorted(s) for s in sorted(slices, key=lambda s: min(s))]


def _heaviest_first(kv: tuple[tuple[int, int], float | tuple]) -> tuple:
    weight = kv[1] if isinstance(kv[1], tuple) else (kv[1],)
    return (*(-w for w in weight), kv[0])


def rank_classes(events: pl.DataFrame, ranks: pl.DataFrame) -> dict[int, str]:
    """Class of each rank's work: its PP stage + a digest of its operation sequence (kind, op, bytes; no bytes
    for a collective whose members contribute different sizes)."""
    ops = events.filter(pl.col("kind") != "compute").select(
        "rank", "seq", pl.col("kind").cast(pl.Utf8), pl.col("op").cast(pl.Utf8), "bytes", "comm_id")
    # an op whose members contribute different sizes in any of its comms sizes itself by the data: its bytes
    # are left out everywhere (in another comm its members may contribute equal sizes by chance)
    uneven = (ops.filter((pl.col("kind") == "collective") & (pl.col("comm_id") >= 0))
              .group_by("comm_id").agg(pl.col("op").first(), (pl.col("bytes").n_unique() > 1).alias("uneven"))
              .filter(pl.col("uneven"))["op"].unique())
    ops = (ops.with_columns(pl.when((pl.col("kind") == "collective") & pl.col("op").is_in(uneven.implode()))
                            .then(pl.lit("v")).otherwise(pl.col("bytes").cast(pl.Utf8)).alias("size"))
           .sort("rank", "seq"))
    digests = {}
    for (rank,), part in ops.group_by(["rank"], maintain_order=True):
        h = hashlib.blake2b(digest_size=8)
        h.update(";".join(f"{k}:{o}:{b}" for k, o, b in zip(part["kind"].to_list(), part["op"].to_list(),
                                                            part["size"].to_list())).encode())
        digests[rank] = h.hexdigest()
    pp = dict(zip(ranks["rank"].to_list(), ranks["pp"].to_list()))
    return {r: f"pp{pp.get(r, -1)}-{d}" for r, d in digests.items()}


class Places:
    """Where a rank sits in a slice: for each group it communicates in, (desc, size, members in the slice),
    and (p2p peers, of them in the slice)."""

    def __init__(self, comms: pl.DataFrame, groups: pl.DataFrame | None) -> None:
        self.groups_of: dict[int, list[int]] = defaultdict(list)
        self.label: list[tuple[str, int]] = []
        used = {g for g in comms["group_name"].cast(pl.Utf8).unique().to_list() if g is not None}
        if groups is not None:
            for name, desc, members in zip(groups["group_name"].to_list(), groups["group_desc"].to_list(),
                                           groups["members"].to_list()):
                if name not in used:
                    continue
                gid = len(self.label)
                self.label.append((desc or "", len(members)))
                for m in members:
                    self.groups_of[m].append(gid)
        self.peers: dict[int, set[int]] = defaultdict(set)
        p2p = comms.filter(pl.col("kind").cast(pl.Utf8) == "p2p").select("src", "dst").unique()
        for a, b in zip(p2p["src"].to_list(), p2p["dst"].to_list()):
            if a >= 0 and b >= 0 and a != b:
                self.peers[a].add(b)
                self.peers[b].add(a)

    def of(self, members: list[int]) -> dict[int, str]:
        inside: dict[int, int] = defaultdict(int)
        for r in members:
            for g in self.groups_of.get(r, ()):
                inside[g] += 1
        here = set(members)
        out = {}
        for r in members:
            place = sorted((*self.label[g], inside[g]) for g in self.groups_of.get(r, ()))
            peers = self.peers.get(r, set())
            text = repr((place, len(peers), len(peers & here)))
            out[r] = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
        return out


def representatives_of(slices: list[list[int]], work: dict[int, str], places: Places,
                       representative: bool) -> tuple[dict[int, str], dict[int, int]]:
    """(rank -> class in its slice, slice -> the slice measuring it)."""
    classes: dict[int, str] = {}
    measured_by: dict[int, int] = {}
    seen: dict[tuple, int] = {}
    for k, members in enumerate(slices):
        where = places.of(members)
        for r in members:
            classes[r] = f"{work.get(r, str(r))}-{where[r]}"
        signature = tuple(sorted(classes[r] for r in members))
        if representative and signature in seen:
            measured_by[k] = seen[signature]
        else:
            seen.setdefault(signature, k)
            measured_by[k] = k
    return classes, measured_by


def plan(graph_dir: Path, devices: int, representative: bool = False, keep_whole: tuple[str, ...] = (),
         rule: str = "sync-first") -> pa.Table:
    try:
        events = pl.from_arrow(artifacts.read_parquet(job_files.graph_table(graph_dir, "events"),
                                                      columns=["rank", "seq", "kind", "op", "bytes", "comm_id",
                                                               "is_async"]))
        comms = pl.from_arrow(artifacts.read_parquet(job_files.graph_table(graph_dir, "comms"),
                                                     columns=["comm_id", "kind", "group_name", "src", "dst", "members",
                                                              "bytes"]))
        ranks = pl.from_arrow(artifacts.read_parquet(job_files.graph_table(graph_dir, "ranks")))
        groups = (pl.from_arrow(artifacts.read_parquet(job_files.graph_table(graph_dir, "groups")))
                  if job_files.graph_table(graph_dir, "groups").is_file() else None)
    except (FileNotFoundError, OSError) as exc:
        raise PlanError(f"cannot read the graph in {graph_dir}: {exc}; run the graph stage first") from None
    if devices < 1:
        raise PlanError(f"--devices must be at least 1 (got {devices})")
    return plan_tables(events, comms, ranks, groups, devices, representative, keep_whole, rule)


def whole_groups(groups: pl.DataFrame | None, descs: tuple[str, ...], p: int) -> list[list[int]]:
    """The member lists of the groups described as one of `descs` that fit in `p`, in the graph's order; a
    description no group has is an error naming those there are."""
    if not descs:
        return []
    have = sorted({d for d in (groups["group_desc"].to_list() if groups is not None else []) if d})
    missing = [d for d in descs if d not in have]
    if missing:
        raise PlanError(f"--keep-whole {','.join(missing)}: no group of the graph is described so (its groups' "
                        f"descriptions: {', '.join(have) or 'none'}); name one of those")
    return [sorted(m) for d, m in zip(groups["group_desc"].to_list(), groups["members"].to_list())
            if d in descs and 1 < len(m) <= p]


def plan_tables(events: pl.DataFrame, comms: pl.DataFrame, ranks: pl.DataFrame, groups: pl.DataFrame | None,
                devices: int, representative: bool = False, keep_whole: tuple[str, ...] = (),
                rule: str = "sync-first") -> pa.Table:
    """The plan from the graph's tables: events (rank, seq, kind, op, bytes, comm_id, is_async), comms (comm_id,
    kind, group_name, src, dst, members, bytes), ranks (rank, pp), groups (group_name, group_desc, members) or
    None; the groups described as one of `keep_whole` merged first, then the pairs in `rule`'s order."""
    world = ranks.height
    slices = cluster(world, devices, pair_order(events, comms, devices, rule),
                     whole_groups(groups, keep_whole, devices))
    classes, measured_by = representatives_of(slices, rank_classes(events, ranks), Places(comms, groups),
                                              representative)
    rows = {"slice": [], "rank": [], "rank_class": [], "measured_by": [], "measured": []}
    for k, members in enumerate(slices):
        for r in members:
            rows["slice"].append(k)
            rows["rank"].append(r)
            rows["rank_class"].append(classes.get(r, ""))
            rows["measured_by"].append(measured_by[k])
            rows["measured"].append(measured_by[k] == k)
    return pa.table(rows, schema=schemas.SLICE_PLAN)


@folder_lock.locks_job("prism slices plan")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism slices plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder holding graph/")
    parser.add_argument("--devices", type=int, required=True, help="device slots P: at most P ranks a slice")
    parser.add_argument("--representative", action="store_true",
                        help="measure one slice per class of equivalent slices")
    parser.add_argument("--rule", choices=RULES, default="sync-first",
                        help="merge pairs by their synchronous comms, then bytes (sync-first), or by bytes alone")
    parser.add_argument("--keep-whole", default="", metavar="DESC[,DESC...]",
                        help="first put each group of these descriptions (group_desc, e.g. tp) in one slice")
    args = parser.parse_args(argv)
    graph = job_files.graph_dir(args.job)
    try:
        run_id = artifacts.same_run([job_files.graph_file(args.job, name) for name in ("events", "comms", "ranks")])
        table = plan(graph, args.devices, args.representative,
                     tuple(d for d in args.keep_whole.split(",") if d), args.rule)
        artifacts.write_outputs(job_files.slices_dir(args.job), {"plan": table}, {"plan": schemas.SLICE_PLAN},
                                run_id=run_id)
    except (PlanError, artifacts.ArtifactError) as exc:
        print(f"prism slices plan: error: {exc}", file=sys.stderr)
        return 2
    n = len(set(table["slice"].to_pylist()))
    measured = len(set(table.filter(table["measured"])["slice"].to_pylist()))
    print(f"prism slices plan: {table.num_rows} ranks in {n} slices of at most {args.devices}; "
          f"{measured} measured ({100 * (1 - measured / n):.0f}% of the slice runs saved)")
    if args.representative and measured == n:
        print(f"prism slices plan: --representative saved nothing here: no two of the {n} slices hold the same "
              "classes of equivalent ranks (ranks are equivalent when they sit at the same pipeline stage, issue "
              "the same sequence of operations and have as many of each group's members beside them in their "
              "slice), so every slice is measured", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
