"""Only the reference workload's group creation (`build_layout`: every rank creates every group of a
TP·PP·DP·EP layout, Megatron style), then one all-reduce over the world: what a capture pays for groups.
`python layout_groups.py TP PP DP EP`; rank 0 prints ``sum=<W>``."""

import sys

import torch
import torch.distributed as dist

from prism.workloads.parallel import build_layout

dist.init_process_group("gloo")
build_layout(*map(int, sys.argv[1:5]))
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"sum={t.item():.0f}")
