"""Runs through under capture; under the mode named by --sleep-in (slice, real), rank 1 sleeps for ever
before the second collective while its peers wait in it: a hang that the watchdog names (issue 23: a slice
run's hang was bounded only by gloo's 30-minute timeout)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--sleep-in", default="slice")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
if os.environ.get("PRISM_MODE") == args.sleep_in and rank == 1:
    time.sleep(3600)  # waits outside communication, using no CPU
dist.all_reduce(torch.ones(1024))
print(f"rank {rank} finished", flush=True)
