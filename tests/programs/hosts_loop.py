"""Test program for a capture over hosts: every step an all-reduce over the world and a message from each
rank to its partner half a world away (another host when the hosts split the world in two); rank 0 prints
`step=N` after each. `--steps N` (default 3), `--sleep S` between steps (a run that lasts, to be killed), `--fail-rank R`."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--fail-rank", type=int, default=-1, help="this rank exits with code 3 at step 2")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
partner = (rank + world // 2) % world
for step in range(1, args.steps + 1):
    if rank == args.fail_rank and step == 2:
        raise SystemExit(3)
    t = torch.full((4,), float(rank + step))
    dist.all_reduce(t)
    out, got = torch.full((2,), float(rank)), torch.empty(2)
    if rank < world // 2:
        dist.send(out, partner)
        dist.recv(got, partner)
    else:
        dist.recv(got, partner)
        dist.send(out, partner)
    assert got[0].item() == partner, (got, partner)
    if rank == 0:
        print(f"step={step} sum={t[0].item():g}", flush=True)
    time.sleep(args.sleep)
dist.destroy_process_group()
