"""All-reduces in groups that the slice mode's replay server plays as ring neighbours (`prism.runtime.slice.ring`).

Run: torchrun --nproc-per-node 8 tests/programs/ring_groups.py
Groups: the world (8) and two halves (4 each), with only all_reduce on them (so both are neighbour rings in a
slice run), and a pair group with a broadcast (the members path). Prints `result <name> <rank> <sha256>` lines:
float sums (blocking, async with a future, a non-contiguous tensor), exact ones (int64 SUM, MAX, a 1-element
count, fewer elements than members, bool-like BOR on uint8, a burst of six async int64 sums in flight at once), a
data-dependent size from a float sum's bits.
"""

import hashlib
import os

import torch
import torch.distributed as dist


def emit(name: str, rank: int, tensor: torch.Tensor) -> None:
    digest = hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
    os.write(1, f"result {name} {rank} {digest}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    half = [dist.new_group(list(range(h * world // 2, (h + 1) * world // 2))) for h in range(2)][rank * 2 // world]
    pair = [dist.new_group([2 * p, 2 * p + 1]) for p in range(world // 2)][rank // 2]
    gen = torch.Generator().manual_seed(99 + rank)
    data = torch.randn(1000, generator=gen) * torch.pow(10.0, torch.randint(-3, 4, (1000,), generator=gen))
    for step in range(2):
        t = data.clone() + step
        dist.all_reduce(t)
        emit(f"world.sum.{step}", rank, t)
        fut = dist.all_reduce(data * 0.5, group=half, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        emit(f"half.future.{step}", rank, fut.wait())
        m = data.view(40, 25)[:, :10]  # not contiguous
        dist.all_reduce(m, group=half)
        emit(f"half.strided.{step}", rank, m)
        i = torch.arange(37, dtype=torch.int64) * (rank + 1) + step
        dist.all_reduce(i)
        emit(f"world.int_sum.{step}", rank, i)
        mx = torch.randint(0, 1000, (13,), generator=gen)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=half)
        emit(f"half.int_max.{step}", rank, mx)
        one = torch.tensor([rank + step])
        dist.all_reduce(one)
        emit(f"world.count.{step}", rank, one)
        few = torch.tensor([rank, 2 * rank, 3], dtype=torch.int32)  # 3 elements, 8 members: empty ring chunks
        dist.all_reduce(few)
        emit(f"world.few.{step}", rank, few)
        bits = torch.tensor([1 << (rank % 8)], dtype=torch.uint8)
        dist.all_reduce(bits, op=dist.ReduceOp.BOR, group=half)
        emit(f"half.bor.{step}", rank, bits)
        b = torch.full((5,), float(rank))
        dist.broadcast(b, src=2 * (rank // 2), group=pair)
        emit(f"pair.broadcast.{step}", rank, b)
        # a burst (DDP's buckets): six async all-reduces issued before any is waited on, which the ring runs
        # two at a time on both sides (gloo's worker threads); exact results, so each op's messages must stay its own
        burst = [torch.arange(11 * (k + 1), dtype=torch.int64) * (rank + 1) + k * step for k in range(6)]
        works = [dist.all_reduce(b, async_op=True) for b in burst]
        for k, (b, w) in enumerate(zip(burst, works)):
            w.wait()
            emit(f"world.burst{k}.{step}", rank, b)
        n = int((t.view(torch.int32) & 1).sum()) % 16 + 1  # data-dependent on a float sum's last bits
        v = torch.ones(n, dtype=torch.int64)
        dist.all_reduce(v)
        emit(f"world.data_dependent.{step}", rank, v)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
