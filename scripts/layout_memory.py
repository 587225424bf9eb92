"""A rank's memory for its process groups (issue 25 item 2): what `build_layout` (every group of the job, the
reference workload's way) costs a capture rank, as a function of W.

A parent warmed like the zygote (torch imported, prism's capture interception installed, `gc.collect()` and
`gc.freeze()`) forks one child per layout; the child becomes rank R of W on a fake store, builds every group,
and reports: its private memory (`memory.private_bytes`: pages it wrote of the parent's, and new ones) before
and after, and after `malloc_trim` (what a capture rank does when it gives its slot back); what `tracemalloc`
says the Python objects it allocated hold at the end (live) and at most (peak); and the largest live
allocations by line.

    .venv/bin/python scripts/layout_memory.py 8,4,256,8 2,2,2048,2          # the W=8192 layouts
    .venv/bin/python scripts/layout_memory.py --rank 4096 --top 5 2,2,4,2 2,2,256,2 2,2,2048,2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

from group_memory import in_forked_child  # (scripts/: this script's folder is on sys.path)

os.environ.setdefault("PRISM_FAST_NONMEMBER", "1")


def child(tp: int, pp: int, dp: int, ep: int, rank: int, top: int, trace: bool) -> dict:
    import tracemalloc

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from prism.runtime import memory
    from prism.workloads.parallel import build_layout

    world = tp * pp * dp
    rank = min(rank, world - 1)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=FakeStore())
    gc.collect()
    memory.trim()
    before = memory.private_bytes()
    if trace:
        tracemalloc.start(1)
    layout = build_layout(tp, pp, dp, ep)
    gc.collect()
    after = memory.private_bytes()
    memory.trim()
    trimmed = memory.private_bytes()
    row = {"layout": f"tp{tp}·pp{pp}·dp{dp}·ep{ep}", "W": world, "rank": rank,
           "groups": tp * pp * dp // tp + tp * pp + tp * dp + tp * pp * dp // ep + tp * pp * ep,
           "member_groups": sum(getattr(layout, f"{n}_group") is not None for n in ("tp", "dp", "pp", "ep", "edp")),
           "private_kib_before": before // 1024, "private_kib_grew": (after - before) // 1024,
           "private_kib_grew_after_trim": (trimmed - before) // 1024}
    if trace:
        live, peak = tracemalloc.get_traced_memory()
        stats = tracemalloc.take_snapshot().statistics("lineno")
        tracemalloc.stop()
        row.update(traced_live_kib=live // 1024, traced_peak_kib=peak // 1024,
                   top=[f"{s.size // 1024} KiB {s.count} blocks {s.traceback[0].filename.split('site-packages/')[-1]}"
                        f":{s.traceback[0].lineno}" for s in stats[:top]])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layouts", nargs="*", default=["8,4,256,8", "2,2,2048,2"], help="tp,pp,dp,ep")
    parser.add_argument("--rank", type=int, default=0, help="the child's rank (capped at W-1)")
    parser.add_argument("--top", type=int, default=0, help="the largest live allocations to print")
    parser.add_argument("--no-trace", action="store_true", help="private memory only (tracemalloc off)")
    parser.add_argument("--json", help="append the rows to this file (one JSON object a line)")
    args = parser.parse_args()
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401

    from prism.runtime import interception, memory
    from prism.workloads import parallel  # noqa: F401

    interception.install("capture", None)
    gc.collect()
    memory.trim()
    gc.freeze()
    for text in args.layouts:
        tp, pp, dp, ep = map(int, text.split(","))
        row = in_forked_child(lambda: child(tp, pp, dp, ep, args.rank, args.top, not args.no_trace))
        row["python"] = sys.version.split()[0]
        traced = (f"; traced live {row['traced_live_kib']} KiB, peak {row['traced_peak_kib']} KiB"
                  if "traced_live_kib" in row else "")
        print(f"{row['layout']} W={row['W']} rank {row['rank']} ({row['groups']} groups, {row['member_groups']} "
              f"its own): private +{row['private_kib_grew']} KiB, after malloc_trim "
              f"+{row['private_kib_grew_after_trim']} KiB{traced}", flush=True)
        for line in row.get("top", []):
            print("   ", line)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
