"""Prints the cores a rank is pinned to and when it ran (`cores rank=R [C,...] START END`); under the mode named
by --slow-in it sleeps between its collectives, so that two runs of it overlap in time."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--slow-in", default="emulate")
parser.add_argument("--sleep", type=float, default=0.5)
args = parser.parse_args()
dist.init_process_group("gloo")
began = time.time()
for _ in range(6):
    dist.all_reduce(torch.ones(4))
    if os.environ.get("PRISM_MODE") == args.slow_in:
        time.sleep(args.sleep)
print(f"cores rank={dist.get_rank()} {sorted(os.sched_getaffinity(0))} {began:.3f} {time.time():.3f}", flush=True)
