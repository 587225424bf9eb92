"""Prints this rank's environment as one JSON line (`env RANK {...}`) and torch's intra-op thread count: the
torchrun-parity test compares it under `prism launch` and under torchrun."""

import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"env {dist.get_rank()} " + json.dumps({**os.environ, "torch.get_num_threads": str(torch.get_num_threads())},
                                             sort_keys=True), flush=True)
dist.barrier()
dist.destroy_process_group()
