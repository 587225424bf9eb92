"""A short DDP training script, torchrun-style: the README's example of "your own program".

    prism launch --nproc 2 --out results/ddp examples/train.py --steps 3     # (or: torchrun --nproc-per-node 2 ...)

It knows nothing of prism: it reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) through
`init_process_group`, trains a small MLP on synthetic data with DistributedDataParallel (gloo on CPU, NCCL when
`--device cuda`). It marks nothing: prism ends an iteration at each optimizer step (a global step post-hook,
prism/runtime/markers.py). Rank 0 prints `step=<k> loss=<value>` (the loss averaged over ranks).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" else "cpu"
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.GELU(), nn.Linear(args.hidden, 1)).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the synthetic data
    x = torch.randn(args.batch, 64, generator=data).to(device)
    y = x[:, :1] * 2 - x[:, 1:2]
    for step in range(args.steps):
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here, bucket by bucket
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the mean loss over ranks, for the log line
        if rank == 0:
            print(f"step={step} loss={total.item() / world:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
