"""A hang: the last rank skips a collective and waits in the next one (real mode waits for ever without
prism's watchdog; capture names it at once).

Run: prism launch --nproc 3 --hang-timeout 2 tests/programs/hang_skipped_collective.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.all_reduce(torch.ones(4))
if rank != world - 1:
    dist.all_reduce(torch.ones(1024))  # the last rank skips this one ...
dist.broadcast(torch.ones(16), src=0)  # ... and is already here
print(f"rank {rank} finished", flush=True)
