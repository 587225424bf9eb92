"""Autograd features of real frameworks whose collectives run inside autograd (issue 21, item 2), in public torch
APIs only; each section trains STEPS steps and prints its losses and a checksum of what it trained.

--features redistribute  DTensor redistribute inside a selective-checkpoint region, with backward through it:
                         Shard(0)->Replicate (all_gather), Partial->Replicate (all_reduce), Partial->Shard(0)
                         (reduce_scatter), Shard(0)->Shard(1) (all_to_all), Replicate->Shard(0) (no comm)
--features functional    functional collectives with autograd (all_reduce, all_gather_tensor_autograd,
                         reduce_scatter_tensor_autograd, all_to_all_single_autograd), eager and in a block
                         compiled with torch.compile (backend aot_eager), under a selective-checkpoint policy
--features pipeline      torch.distributed.pipelining, 2 stages a rank, ScheduleInterleaved1F1B, every stage's
                         block under selective checkpointing; then Schedule1F1B, 1 stage a rank, full AC
--features reshard       FSDP2 with reshard_after_forward True (a block under full AC: its recomputation
                         all-gathers again), False (the root), and an int (a block resharded to 2 ranks, W=4)

Run: torchrun --nproc-per-node 2 tests/programs/autograd_features.py --features redistribute,functional,pipeline
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import argparse
import functools
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

STEPS, DIM = 2, 8
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)

_SAVE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
         torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.all_gather_into_tensor.default,
         torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops._c10d_functional.all_to_all_single.default,
         torch.ops._c10d_functional.wait_tensor.default}


def emit(name: str, rank: int, *values) -> None:
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def sac(fn, *args):
    """`fn(*args)` under selective activation checkpointing (matmuls and collectives saved, the rest recomputed)."""
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=functools.partial(create_selective_checkpoint_contexts, _policy))


def redistribute(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    w = nn.Parameter(torch.randn(DIM, DIM))
    opt = torch.optim.SGD([w], lr=0.1)
    gen = torch.Generator().manual_seed(10 + rank)

    def block(x, w):
        xs = DTensor.from_local(x, mesh, [Shard(0)])  # each rank its rows
        full = xs.redistribute(mesh, [Replicate()])  # all_gather
        part = DTensor.from_local(full.to_local() @ w, mesh, [Partial()])  # a partial sum per rank
        rep = part.redistribute(mesh, [Replicate()])  # all_reduce
        sh = DTensor.from_local(torch.tanh(rep.to_local()) @ w, mesh, [Partial()]).redistribute(
            mesh, [Shard(0)])  # reduce_scatter
        cols = sh.redistribute(mesh, [Shard(1)])  # all_to_all
        back = DTensor.from_local(torch.relu(rep.to_local()), mesh, [Replicate()]).redistribute(
            mesh, [Shard(0)])  # a local chunk, no communication
        return (cols.to_local().square().sum() + back.to_local().sum()) / world

    for step in range(STEPS):
        x = torch.randn(4, DIM, generator=gen)
        loss = sac(block, x, w)
        loss.backward()
        opt.step()
        opt.zero_grad()
        emit(f"redistribute_loss{step}", rank, f"{loss.item():.12e}")
    emit("redistribute_w", rank, checksum([w]))


def _funcol_block(x, w, group):
    y = funcol.all_reduce(x @ w, "sum", group)
    g = funcol.all_gather_tensor_autograd(torch.tanh(y), 0, group)
    r = funcol.reduce_scatter_tensor_autograd(g @ w, "sum", 0, group)
    a = funcol.all_to_all_single_autograd(torch.relu(r), None, None, group)
    return funcol.wait_tensor(a).square().mean()


def functional(rank: int, world: int) -> None:
    group = dist.group.WORLD
    torch.manual_seed(2)
    w = nn.Parameter(torch.randn(DIM, DIM) / DIM)
    opt = torch.optim.SGD([w], lr=0.1)
    gen = torch.Generator().manual_seed(20 + rank)
    compiled = torch.compile(_funcol_block, backend="aot_eager", fullgraph=True)
    for step in range(STEPS):
        x = torch.randn(2 * world, DIM, generator=gen)
        eager = sac(_funcol_block, x, w, group)
        comp = compiled(x, w, group)
        (eager + comp).backward()
        opt.step()
        opt.zero_grad()
        emit(f"functional_loss{step}", rank, f"{eager.item():.12e}", f"{comp.item():.12e}")
    emit("functional_w", rank, checksum([w]))


class Block(nn.Module):
    def __init__(self, ac: str = "none") -> None:
        super().__init__()
        self.up, self.down, self.ac = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM), ac

    def inner(self, x):
        return x + self.down(torch.tanh(self.up(x)))

    def forward(self, x):
        if self.ac == "sac":
            return sac(self.inner, x)
        if self.ac == "full":
            return checkpoint(self.inner, x, use_reentrant=False)
        return self.inner(x)


def _train_pipeline(name, rank, stages, schedule, modules) -> None:
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.05)
    gen = torch.Generator().manual_seed(30)  # the same batch on every rank: the first stage reads it
    for step in range(STEPS):
        x, y = torch.randn(8, DIM, generator=gen), torch.randn(8, DIM, generator=gen)
        losses = []
        if stages[0].is_first:
            schedule.step(x)
        elif stages[-1].is_last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if stages[0].is_first and stages[-1].is_last:
            raise AssertionError("one rank holds the first and the last stage")
        opt.step()
        opt.zero_grad()
        if losses:
            emit(f"{name}_loss{step}", rank, " ".join(f"{v.item():.12e}" for v in losses))
    emit(f"{name}_w", rank, checksum([p for m in modules for p in m.parameters()]))


def pipeline(rank: int, world: int) -> None:
    loss_fn = nn.MSELoss()
    # interleaved: 2 stages a rank (stage s on rank s % world), 4 microbatches, selective checkpointing
    ids = [rank, rank + world]
    modules = []
    for s in ids:
        torch.manual_seed(100 + s)
        modules.append(Block("sac"))
    stages = [PipelineStage(m, s, 2 * world, torch.device("cpu")) for m, s in zip(modules, ids)]
    _train_pipeline("interleaved", rank, stages, ScheduleInterleaved1F1B(stages, 4, loss_fn=loss_fn), modules)
    # 1F1B: one stage a rank, full activation checkpointing
    torch.manual_seed(200 + rank)
    module = Block("full")
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    _train_pipeline("1f1b", rank, [stage], Schedule1F1B(stage, 4, loss_fn=loss_fn), [module])


def reshard(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(3)
    model = nn.Sequential(Block("full"), Block("sac"), nn.Linear(DIM, 4))
    fully_shard(model[0], mesh=mesh, reshard_after_forward=True)
    fully_shard(model[1], mesh=mesh, reshard_after_forward=2 if world % 2 == 0 and world > 2 else True)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(40 + rank)
    for step in range(STEPS):
        total = 0.0
        for _ in range(2):  # two microbatches: the resharded parameters are gathered again for each
            loss = nn.functional.mse_loss(model(torch.randn(4, DIM, generator=gen)), torch.zeros(4, 4))
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        emit(f"reshard_loss{step}", rank, f"{total:.12e}")
    emit("reshard_w", rank, checksum(p.full_tensor() for p in model.parameters()))


SECTIONS = {"redistribute": redistribute, "functional": functional, "pipeline": pipeline, "reshard": reshard}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--features", default="redistribute,functional,pipeline")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in args.features.split(","):
        SECTIONS[name](rank, world)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
