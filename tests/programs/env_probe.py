"""Prints this rank's environment as one JSON line (`env RANK {...}`) and torch's intra-op thread count: the
torchrun-parity test compares it under `prism launch` and under torchrun. The ranks print in turn (a barrier
between them): the two ranks share torchrun's stdout, and a line longer than a pipe's atomic write, or one
written as two writes (PYTHONUNBUFFERED), could otherwise interleave with the other rank's."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for turn in range(dist.get_world_size()):
    if turn == dist.get_rank():
        print(f"env {turn} " + json.dumps({**os.environ, "torch.get_num_threads": str(torch.get_num_threads())},
                                          sort_keys=True), flush=True)
    dist.barrier()
dist.destroy_process_group()
