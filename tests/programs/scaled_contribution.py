"""All-reduces whose result tells a live contribution from a recorded one (prism emulate's test (b)).

Run: torchrun --nproc-per-node 4 tests/programs/scaled_contribution.py [--scale-rank R --scale F] [--crash-rank R]
Each step every rank all-reduces values of very different magnitudes (every summation order rounds
differently) and prints `result step=<k> <rank> <sha256 of the sum's bytes>`. With `--scale-rank R`, rank R
multiplies its contribution by F at step 1 (a changed program, same communication): an emulation that
computes with the live contribution prints another step-1 sum than the capture of the unchanged program.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist


def contribution(rank: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(1024, generator=gen) * torch.pow(10.0, torch.randint(-3, 4, (1024,), generator=gen))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scale-rank", type=int, default=-1)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank raises at step 1 (a crashing program)")
    p.add_argument("--grow-rank", type=int, default=-1,
                   help="this rank's step-1 contribution is twice as long (communication departs in size)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(a.steps):
        if rank == a.crash_rank and step == 1:
            raise RuntimeError("deliberate crash at step 1")
        t = contribution(rank, step)
        if rank == a.scale_rank and step == 1:
            t = t * a.scale
        if rank == a.grow_rank and step == 1:
            t = torch.cat([t, t])
        dist.all_reduce(t)
        digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]
        os.write(1, f"result step={step} {rank} {digest}\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
