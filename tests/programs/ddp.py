"""DistributedDataParallel on a small MLP: 3 steps of SGD, then 3 of AdamW (public torch APIs only).

Run: torchrun --nproc-per-node 2 tests/programs/ddp.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(params) -> str:
    flat = torch.cat([p.detach().reshape(-1).double() for p in params])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for opt_name in ("sgd", "adamw"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        ddp = DDP(model, bucket_cap_mb=0.001)  # small buckets: several allreduces per backward
        if opt_name == "sgd":
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        else:
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(100 + rank)
        for step in range(3):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randn(8, 4, generator=gen)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            emit(f"{opt_name}.loss{step}", rank, f"{loss.item():.12e}")
        emit(f"{opt_name}.params", rank, checksum(ddp.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
