"""A deadlock: ranks 0 and 1 both send to each other before receiving (gloo's send waits for the peer's
recv), so neither ever gets to its recv.

Run: prism launch --nproc 2 --hang-timeout 2 tests/programs/hang_send_deadlock.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
dist.all_reduce(torch.ones(2))
dist.send(torch.full((8,), float(rank)), peer, tag=7)
got = torch.empty(8)
dist.recv(got, peer, tag=7)
print(f"rank {rank} finished", flush=True)
