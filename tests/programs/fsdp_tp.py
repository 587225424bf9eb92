"""FSDP2 x TP on a 2-D DeviceMesh ("dp", "tp"): 4 ranks, 3 steps of AdamW (public torch APIs only).

Run: torchrun --nproc-per-node 4 tests/programs/fsdp_tp.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.out = nn.Linear(dim, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    rank, dp_rank = dist.get_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + dp_rank)  # the same batch within a TP group
    for step in range(3):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        emit(f"loss{step}", rank, f"{loss.item():.12e}")
    emit("shards", rank, checksum(p.to_local() for p in model.parameters()))
    emit("full", rank, checksum(p.full_tensor() for p in model.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
