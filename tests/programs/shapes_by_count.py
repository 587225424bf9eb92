"""Collectives whose members pass the same number of elements in different shapes, which gloo and NCCL carry
(they move counts): DeepSpeed's pipeline engine all-reduces its loss as a 0-d tensor on one stage and as a
[1] tensor on another. all_reduce 0-d vs [1], all_reduce [2, 3] vs [6], broadcast [2, 3] vs [6], each in a
loop of 2 steps.

Run: torchrun --nproc-per-node 2 tests/programs/shapes_by_count.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os

import torch
import torch.distributed as dist


def emit(name: str, rank: int, t: torch.Tensor) -> None:
    values = " ".join(f"{v:.8e}" for v in t.reshape(-1).tolist())
    os.write(1, f"result {name} {rank} {list(t.shape)} {values}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(2):
        loss = torch.tensor(1.5 + rank + step) if rank == 0 else torch.tensor([1.5 + rank + step])
        dist.all_reduce(loss)
        emit(f"loss{step}", rank, loss)
        grid = torch.arange(6.0) * (rank + 1) + step
        grid = grid.view(2, 3) if rank % 2 == 0 else grid
        dist.all_reduce(grid)
        emit(f"grid{step}", rank, grid)
        root = torch.arange(6.0) + 10 * step if rank == 0 else torch.zeros(2, 3)
        dist.broadcast(root, src=0)
        emit(f"bcast{step}", rank, root)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
