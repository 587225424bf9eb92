"""Rank --early-rank returns (exit 0) after the first all_reduce; the others call a second one and fail on the
connection it closed: the launcher names the early exit, not only the peer's gloo error. With --early-in MODE
only under that mode (a capture runs through, its slice or emulate run exits early)."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--early-rank", type=int, default=1)
parser.add_argument("--early-in", default=None, help="only under this PRISM_MODE (default: every mode)")
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
early = args.early_in is None or os.environ.get("PRISM_MODE") == args.early_in
if dist.get_rank() != args.early_rank or not early:
    dist.all_reduce(t)
    print("unreachable: the early rank took no part", flush=True)
