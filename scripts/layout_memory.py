"""A rank's memory for its process groups: RSS before and after `build_layout` (every group of the job, the
reference workload's way) in one process, prism's capture interception installed (non-member groups answered by
prism), rank 0 of W on a fake store.   .venv/bin/python scripts/layout_memory.py 8,4,256,8 2,2,2048,2"""

import gc
import os
import sys

os.environ.setdefault("PRISM_FAST_NONMEMBER", "1")


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one(tp: int, pp: int, dp: int, ep: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from prism.runtime import interception
    from prism.workloads.parallel import build_layout

    interception.install("capture", None)
    dist.init_process_group("gloo", rank=0, world_size=tp * pp * dp, store=FakeStore())
    gc.collect()
    before = rss_mib()
    layout = build_layout(tp, pp, dp, ep)
    gc.collect()
    after = rss_mib()
    print(f"tp{tp}·pp{pp}·dp{dp}·ep{ep} W={tp * pp * dp}: RSS {before:.1f} -> {after:.1f} MiB (+{after - before:.2f})")
    del layout


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        one(*map(int, sys.argv[2:]))
    else:
        import subprocess

        for text in sys.argv[1:] or ["8,4,256,8", "2,2,2048,2"]:
            subprocess.run([sys.executable, __file__, "--one", *text.split(",")], check=True)
