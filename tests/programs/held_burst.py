"""Two async all-reduces issued back to back, the second waited first: what a burst of gradient buckets does.

Run: torchrun --nproc-per-node 2 tests/programs/held_burst.py
Prints `timing <rank> <s to the second's wait end> <s to the first's wait end>` (both from just before the
first is issued) and `result <name> <rank> <sha256>` lines. The emulation's test calibrates the first
all-reduce to a long transfer and the second to a short one: the second must not wait for the first's hold.
"""

import hashlib
import os
import time

import torch
import torch.distributed as dist


def emit(name: str, rank: int, tensor: torch.Tensor) -> None:
    digest = hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
    os.write(1, f"result {name} {rank} {digest}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    second = torch.full((4096,), 0.5) * (rank + 1)
    began = time.monotonic()
    a = dist.all_reduce(first, async_op=True)
    b = dist.all_reduce(second, async_op=True)
    b.wait()
    second_s = time.monotonic() - began
    a.wait()
    first_s = time.monotonic() - began
    os.write(1, f"timing {rank} {second_s:.4f} {first_s:.4f}\n".encode())
    emit("first", rank, first)
    emit("second", rank, second)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
