"""Which slice plans a rule would change, offline on capture graphs (issue 24, session 18): per config, the plan of
the bytes rule (`prism slices plan`), of `--keep-whole tp`, and of a candidate rule that finds synchronous groups
from the graph (pairs merged first along the count of synchronous collectives and messages they share, a comm
being synchronous when no member's event of it is asynchronous; then by bytes), and which groups each plan splits.

    python3 scripts/plan_rules.py F/a/CONFIG [F/b/CONFIG ...]      (a bench config folder: prism0/graph)
"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl

from prism.slices import plan as slice_plan


def sync_counts(graph: Path, p: int) -> dict[tuple[int, int], float]:
    ev = pl.read_parquet(graph / "events.parquet", columns=["comm_id", "is_async"]).filter(pl.col("comm_id") >= 0)
    sync = set(ev.group_by("comm_id").agg(pl.col("is_async").any().alias("a")).filter(~pl.col("a"))["comm_id"])
    comms = pl.read_parquet(graph / "comms.parquet", columns=["comm_id", "members", "src", "dst", "kind"])
    w: dict[tuple[int, int], float] = defaultdict(float)
    for cid, members, src, dst, kind in comms.iter_rows():
        if cid not in sync:
            continue
        ranks = [src, dst] if kind == "p2p" else list(members)
        if len(ranks) < 2 or len(ranks) > p:
            continue
        for i in range(len(ranks)):
            for j in range(i + 1, len(ranks)):
                w[tuple(sorted((ranks[i], ranks[j])))] += 1
    return w


def split_groups(graph: Path, slices: list[list[int]]) -> str:
    g = pl.read_parquet(graph / "groups.parquet", columns=["group_desc", "members"])
    where = {r: k for k, s in enumerate(slices) for r in s}
    out = Counter()
    for desc, members in g.iter_rows():
        if 1 < len(members) < sum(len(s) for s in slices):
            out[(desc, len(members), len({where[m] for m in members}) == 1)] += 1
    return " ".join(f"{d}{n}:{'in' if whole else 'SPLIT'}" for (d, n, whole), _ in sorted(out.items()))


def main(argv: list[str]) -> int:
    print("| config | rule | slices | groups (in: whole in a slice) |\n|---|---|---|---|")
    for d in map(Path, argv):
        graph = d / "prism0" / "graph"
        plan = pl.read_parquet(d / "prism0" / "slices" / "plan.parquet")
        p = plan.group_by("slice").len()["len"].max()
        world = plan.height
        comms = pl.read_parquet(graph / "comms.parquet", columns=["kind", "group_name", "src", "dst", "members", "bytes"])
        groups = pl.read_parquet(graph / "groups.parquet")
        by_bytes = slice_plan._pair_weights(comms, p)
        rules = {"bytes": slice_plan.cluster(world, p, by_bytes),
                 "keep tp": slice_plan.cluster(world, p, by_bytes, slice_plan.whole_groups(groups, ("tp",), p))
                 if "tp" in groups["group_desc"].to_list() else None}
        sync = sync_counts(graph, p)
        top = max(by_bytes.values()) if by_bytes else 1.0
        rules["sync first"] = slice_plan.cluster(world, p, {k: sync.get(k, 0) * top * 10 + v for k, v in
                                                            {**{k: 0.0 for k in sync}, **by_bytes}.items()})
        for name, slices in rules.items():
            if slices is not None:
                print(f"| {d.name} | {name} | {slices} | {split_groups(graph, slices)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
