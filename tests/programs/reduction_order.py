"""Reductions whose last bits depend on the order of the sum, and a program path that depends on those bits.

Run: torchrun --nproc-per-node 4 tests/programs/reduction_order.py
Prints `result <name> <rank> <sha256 of the result's bytes>` lines. With more than two ranks, gloo's ring
order and prism's fixed left fold give different bits; a slice run must print what its capture printed.
The size of the last all_gather depends on the bits of the first all_reduce (like MoE routing).
"""

import hashlib
import os
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor is deprecated


def emit(name: str, rank: int, tensor: torch.Tensor) -> None:
    digest = hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
    os.write(1, f"result {name} {rank} {digest}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1234 + rank)
    # values of very different magnitudes: every order of the sum rounds differently
    data = torch.randn(4096, generator=gen) * torch.pow(10.0, torch.randint(-3, 4, (4096,), generator=gen))

    t = data.clone()
    dist.all_reduce(t)
    emit("all_reduce", rank, t)

    fut = dist.all_reduce(data * 0.5, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    emit("all_reduce.future", rank, fut.wait())

    out = torch.empty(4096 // world)
    dist.reduce_scatter_tensor(out, data)
    emit("reduce_scatter_tensor", rank, out)

    outs = [torch.empty(4096 // world)]
    dist.reduce_scatter(outs[0], list(data.chunk(world)))
    emit("reduce_scatter", rank, outs[0])

    r = data.clone()
    dist.reduce(r, dst=0)
    if rank == 0:
        emit("reduce", rank, r)

    # data-dependent: how many sums have an odd last mantissa bit decides how much is gathered next
    n = int((t.view(torch.int32) & 1).sum()) % 64 + 1
    got = [torch.empty(n) for _ in range(world)]
    dist.all_gather(got, torch.full((n,), float(rank)))
    emit("all_gather.data_dependent", rank, torch.cat(got))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
