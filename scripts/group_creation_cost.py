"""CPU seconds one rank of the reference workload spends creating its process groups (`build_layout`: every
rank creates every group of the job, Megatron style, W/tp + W/dp + W/pp + W/ep + W*ep/dp of them), measured in
one process on torch's fake backend (no communication). In a capture every rank pays it on the P slots: W
times this over P is slot time before the first step (issue 12: why W=8192 costs more than 8x W=1024).

    .venv/bin/python scripts/group_creation_cost.py 2,4,128,8 4,8,128,8 8,4,256,8
"""

from __future__ import annotations

import subprocess
import sys

ONE = """
import sys, time
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from prism.workloads.parallel import build_layout
tp, pp, dp, ep = map(int, sys.argv[1:5])
dist.init_process_group("fake", rank=0, world_size=tp * pp * dp, store=FakeStore())
began = time.process_time()
build_layout(tp, pp, dp, ep)
print(time.process_time() - began)
"""


def main() -> int:
    print(f"{'layout':<22} {'W':>5} {'groups a rank':>13} {'CPU s a rank':>12} {'x W / 16 slots':>15}")
    for text in sys.argv[1:] or ["2,4,128,8", "4,8,128,8", "8,4,256,8"]:
        tp, pp, dp, ep = (int(x) for x in text.split(","))
        w = tp * pp * dp
        groups = w // tp + w // dp + w // pp + w // ep + w * ep // dp
        out = subprocess.run([sys.executable, "-c", ONE, str(tp), str(pp), str(dp), str(ep)], capture_output=True,
                             text=True, check=True).stdout
        s = float(out.split()[-1])
        print(f"tp{tp}·pp{pp}·dp{dp}·ep{ep}".ljust(22) + f" {w:>5} {groups:>13,} {s:>12.3f} {s * w / 16:>13.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
