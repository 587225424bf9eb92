"""`torch.distributed.pipelining`: one stage per rank (`PipelineStage`), 4 microbatches, GPipe or 1F1B, 2 steps.

Run: torchrun --nproc-per-node 2 tests/programs/pipelining.py [--schedule gpipe|1f1b|both]
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

DIM, MICROBATCHES, BATCH = 16, 4, 8
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


def stage_module(stage: int, last: bool) -> nn.Module:
    torch.manual_seed(stage)  # each stage's weights, the same whichever launcher runs it
    layers = [nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM)]
    if last:
        layers += [nn.ReLU(), nn.Linear(DIM, 4)]
    return nn.Sequential(*layers)


def run(schedule_name: str, rank: int, world: int) -> None:
    module = stage_module(rank, rank == world - 1)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    is_last = rank == world - 1
    # every rank passes loss_fn: a schedule without one runs forward only
    schedule = SCHEDULES[schedule_name](stage, n_microbatches=MICROBATCHES, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100)
    for step in range(2):
        x = torch.randn(BATCH, DIM, generator=gen)
        y = torch.randn(BATCH, 4, generator=gen)
        losses = []
        if rank == 0:
            schedule.step(x)
        elif is_last:
            out = schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
        if is_last:
            emit(f"{schedule_name}.loss{step}", rank, " ".join(f"{l.item():.12e}" for l in losses))
            emit(f"{schedule_name}.out{step}", rank, checksum([out]))
    emit(f"{schedule_name}.params", rank, checksum(module.parameters()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", choices=[*SCHEDULES, "both"], default="both")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in SCHEDULES if args.schedule == "both" else [args.schedule]:
        run(name, rank, world)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
