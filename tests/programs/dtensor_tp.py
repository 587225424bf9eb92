"""DTensor tensor parallelism (`parallelize_module`, Colwise/Rowwise) on a 1-D mesh, 3 steps of SGD.

Run: torchrun --nproc-per-node 2 tests/programs/dtensor_tp.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


class MLP(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.w3, self.w4 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = self.w2(torch.relu(self.w1(x)))
        return self.w4(torch.relu(self.w3(x)))


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    rank = mesh.get_rank()
    torch.manual_seed(0)
    model = MLP()
    plan = {"w1": ColwiseParallel(), "w2": RowwiseParallel(), "w3": ColwiseParallel(), "w4": RowwiseParallel()}
    model = parallelize_module(model, mesh, plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100)  # the same batch on every TP rank
    for step in range(3):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 16, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        emit(f"loss{step}", rank, f"{loss.item():.12e}")
    emit("shards", rank, checksum(p.to_local() for p in model.parameters()))
    emit("full", rank, checksum(p.full_tensor() for p in model.parameters()))
    # a few DTensor ops beyond the module: redistribute Shard(0) -> Replicate, a sharded matmul
    a = distribute_tensor(torch.arange(32.0).reshape(8, 4), mesh, [Shard(0)])
    b = distribute_tensor(torch.arange(16.0).reshape(4, 4) / 7, mesh, [Shard(1)])
    c = (a @ b).full_tensor()
    emit("matmul", rank, checksum([c]))
    assert isinstance(a, DTensor)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
