"""The groups of a job's slice plan that are all-slice (every member in one slice), by slice: a slice rank's
transport keeps the program's NCCL only for those (`prism/runtime/slice/transport.py`), and falls back to gloo
where their members share one CUDA device (NCCL refuses two ranks on one device).

    python scripts/frameworks/slice_groups.py JOB     (after `prism graph` and `prism slices plan`)
"""

import collections
import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(job: Path) -> int:
    for need in ("slices/plan.parquet", "graph/groups.parquet"):
        if not (job / need).is_file():
            print(f"slice_groups.py: {job / need} missing: run `prism graph` and `prism slices plan` on {job} first",
                  file=sys.stderr)
            return 2
    slices = collections.defaultdict(set)
    for row in pq.read_table(job / "slices/plan.parquet", columns=["slice", "rank"]).to_pylist():
        slices[row["slice"]].add(row["rank"])
    groups = pq.read_table(job / "graph/groups.parquet", columns=["group_desc", "size", "members"]).to_pylist()
    print("slice\tranks\tall-slice groups of 2+ members (desc: members)")
    for s, ranks in sorted(slices.items()):
        inside = sorted({(g["group_desc"], tuple(g["members"])) for g in groups
                         if g["size"] > 1 and ranks.issuperset(g["members"])})
        print(f"{s}\t{sorted(ranks)}\t" + ("; ".join(f"{d}: {list(m)}" for d, m in inside) or "none"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/frameworks/slice_groups.py JOB")
    sys.exit(main(Path(sys.argv[1])))
