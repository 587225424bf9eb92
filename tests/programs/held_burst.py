"""A burst of async all-reduces, the second waited first (what gradient buckets do), then, on the group of
ranks 0 and 1, an all_gather_into_tensor and an all-reduce SUM (native ops when both are sandbox ranks) and
an all-reduce MAX (prism's protocol).

Run: torchrun --nproc-per-node 4 tests/programs/held_burst.py
Prints `timing <rank> <second> <first> [<pair gather> <pair all-reduce> <pair max>]`: seconds from just before the
first is issued to the end of each wait (the pair's ops on ranks 0 and 1 only), and `result <name> <rank>
<sha256>` lines. The emulation's test calibrates the first all-reduce, the pair's all-gather and the pair's
all-reduce and max to long transfers and the second to a short one.
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
    pair = dist.new_group([0, 1])
    first = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    second = torch.full((4096,), 0.5) * (rank + 1)
    began = time.monotonic()
    a = dist.all_reduce(first, async_op=True)
    b = dist.all_reduce(second, async_op=True)
    b.wait()
    times = [time.monotonic() - began]
    a.wait()
    times.append(time.monotonic() - began)
    if rank in (0, 1):
        gathered = torch.empty(128)
        dist.all_gather_into_tensor(gathered, torch.full((64,), float(rank)), group=pair)
        times.append(time.monotonic() - began)
        third = torch.full((64,), 2.0) * (rank + 1)
        dist.all_reduce(third, group=pair)
        times.append(time.monotonic() - began)
        fourth = torch.full((64,), 3.0) * (rank + 1)
        dist.all_reduce(fourth, op=dist.ReduceOp.MAX, group=pair)
        times.append(time.monotonic() - began)
        emit("pair.gather", rank, gathered)
        emit("pair.all_reduce", rank, third)
        emit("pair.max", rank, fourth)
    os.write(1, f"timing {rank} {' '.join(f'{t:.4f}' for t in times)}\n".encode())
    emit("first", rank, first)
    emit("second", rank, second)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
