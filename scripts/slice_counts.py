"""How many slices `prism slices plan --representative` measures, from the plan alone (issue 25: at W=1024 on
P=16 it measured every slice, which blew the host call's budget).

    .venv/bin/python scripts/slice_counts.py --devices 16,4,2 --synthetic 16,64,256,1024,2048,4096,8192
    .venv/bin/python scripts/slice_counts.py --devices 16,4,2 --jobs /tmp/sc/w16 /tmp/sc/w64 /tmp/sc/w256

`--synthetic`: the reference workload's graph structure without a capture (`tests/unit/layoutgen.moe_graph`),
on the weak layouts tp2·pp2·ep2·dp(W/4) (`scale_slices.WEAK`) and the bench's cost layouts
(`capture_scale.LAYOUTS`). `--jobs`: real job folders holding graph/ (a capture and `prism graph`; the plan's
--devices need not be the capture's). Prints W, layout, P, slices, measured, the plan's seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.unit.layoutgen

from prism.bench.capture_scale import LAYOUTS  # noqa: E402
from prism.bench.scale_slices import WEAK  # noqa: E402
from prism.slices import plan as slice_plan  # noqa: E402


def _count(table) -> tuple[int, int]:
    return (len(set(table["slice"].to_pylist())),
            len(set(table.filter(table["measured"])["slice"].to_pylist())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="16")
    parser.add_argument("--synthetic", default="")
    parser.add_argument("--jobs", nargs="*", type=Path, default=[])
    args = parser.parse_args()
    devices = [int(p) for p in args.devices.split(",")]
    print(f"{'source':<10} {'W':>5} {'layout':<22} {'P':>3} {'slices':>7} {'measured':>9} {'plan s':>7}")
    for job in args.jobs:
        import polars as pl

        ranks = pl.read_parquet(job / "graph" / "ranks.parquet")
        w = ranks.height
        for p in devices:
            began = time.monotonic()
            n, m = _count(slice_plan.plan(job / "graph", p, representative=True))
            print(f"{'capture':<10} {w:>5} {job.name:<22} {p:>3} {n:>7} {m:>9} {time.monotonic() - began:>7.1f}")
    if args.synthetic:
        from tests.unit.layoutgen import moe_graph

        for name, layouts in (("weak", WEAK), ("cost", LAYOUTS)):
            for w in (int(x) for x in args.synthetic.split(",")):
                if w not in layouts:
                    continue
                graph = moe_graph(*layouts[w])
                for p in devices:
                    began = time.monotonic()
                    n, m = _count(slice_plan.plan_tables(*graph, p, representative=True))
                    layout = "tp{}·pp{}·dp{}·ep{}".format(*layouts[w])
                    print(f"{'synth ' + name:<10} {w:>5} {layout:<22} {p:>3} {n:>7} {m:>9} "
                          f"{time.monotonic() - began:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
