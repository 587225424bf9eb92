"""Rank --early-rank returns (exit 0) after the first all_reduce; the others call a second one and fail on the
connection it closed: the launcher names the early exit, not only the peer's gloo error."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--early-rank", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() != args.early_rank:
    dist.all_reduce(t)
    print("unreachable: the early rank took no part", flush=True)
