"""Megatron-style group creation: every rank creates many groups and uses one (the world).

`python unused_groups.py N M`: N groups of the last two ranks (ranks 0 and 1 are not members) and M groups
of ranks 0 and 1 (members, never used). Rank 0 prints its private memory's growth over the N groups:
``nonmember_growth_bytes=<n>``."""

import sys

import torch
import torch.distributed as dist

from prism.runtime import memory

dist.init_process_group("gloo")
n, m = int(sys.argv[1]), int(sys.argv[2])
world, rank = dist.get_world_size(), dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
before = memory.private_bytes()
for _ in range(n):
    dist.new_group([world - 2, world - 1])
growth = memory.private_bytes() - before
for _ in range(m):
    dist.new_group([0, 1])
dist.all_reduce(t)
if rank == 0:
    print(f"nonmember_growth_bytes={growth}")
    print(f"sum={t.tolist()}")
