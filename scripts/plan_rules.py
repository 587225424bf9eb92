"""Which slice plans a rule changes, offline on capture graphs (issue 24, sessions 18-19): per config, the plan of
`prism slices plan --rule bytes`, of `--rule bytes --keep-whole tp`, and of the default `--rule sync-first` (pairs
merged first along the comms they share that one of the two waits on at once, then by bytes), and which groups each
plan splits.

    python3 scripts/plan_rules.py F/a/CONFIG [F/b/CONFIG ...]      (a bench config folder: prism0/graph)
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import polars as pl

from prism.slices import plan as slice_plan


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
        comms = pl.read_parquet(graph / "comms.parquet",
                                columns=["comm_id", "kind", "group_name", "src", "dst", "members", "bytes"])
        events = pl.read_parquet(graph / "events.parquet", columns=["rank", "comm_id", "is_async"])
        groups = pl.read_parquet(graph / "groups.parquet")
        by_bytes = slice_plan.pair_order(events, comms, p, "bytes")
        rules = {"bytes": slice_plan.cluster(world, p, by_bytes),
                 "keep tp": slice_plan.cluster(world, p, by_bytes, slice_plan.whole_groups(groups, ("tp",), p))
                 if "tp" in groups["group_desc"].to_list() else None,
                 "sync-first": slice_plan.cluster(world, p, slice_plan.pair_order(events, comms, p, "sync-first"))}
        for name, slices in rules.items():
            if slices is not None:
                print(f"| {d.name} | {name} | {slices} | {split_groups(graph, slices)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
