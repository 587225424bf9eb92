"""FSDP2 (`fully_shard`, per layer + root) on a small model, 3 steps of AdamW (public torch APIs only).

Run: torchrun --nproc-per-node 2 tests/programs/fsdp2.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.out = nn.Linear(dim, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(3):
        x = torch.randn(8, 8, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        emit(f"loss{step}", rank, f"{loss.item():.12e}")
    # local shards (differ per rank) and the full parameters (same on every rank)
    emit("shards", rank, checksum(p.to_local() for p in model.parameters()))
    emit("full", rank, checksum(p.full_tensor() for p in model.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
