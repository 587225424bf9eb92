"""Runs through unless PRISM_MODE is --stall-in: then every rank sleeps before its first process group, so no
collective is ever issued and the hang watchdog (which starts at the first group) sees nothing: a stall only
the launcher's progress watchdog names (issue 23: a slice run once hung 6 minutes with an empty log)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--stall-in", default="slice")
args = parser.parse_args()
if os.environ.get("PRISM_MODE") == args.stall_in:
    time.sleep(3600)  # waits outside communication, using no CPU
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
print(f"rank {dist.get_rank()} finished", flush=True)
