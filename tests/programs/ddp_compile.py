"""`torch.compile(DDP(model))`: 3 steps of SGD with the compiled DDP model (public torch APIs only).

Run: torchrun --nproc-per-node 2 tests/programs/ddp_compile.py [--backend aot_eager|inductor|eager]
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import argparse
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = DDP(model)
    compiled = torch.compile(ddp, backend=args.backend)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(3):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        loss = nn.functional.mse_loss(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        emit(f"loss{step}", rank, f"{loss.item():.12e}")
    emit("params", rank, checksum(ddp.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
