"""The training-loop patterns of real frameworks (torchtitan, Megatron, torchtune), in public torch APIs only:
FSDP2 (x TP on a 2-D mesh with --tp 2), activation checkpointing, a loss module outside the model,
gradient accumulation with an LR scheduler, and an optimizer wrapper.

--optim plain      one AdamW
--optim container  an `Optimizer` whose `step()` calls the inner optimizers' `step()` (torchtitan's
                   OptimizersContainer, Megatron's ChainedOptimizer): one per model part
--optim several    one optimizer per model part, stepped one after the other by the loop (pipeline stages)
--ac none|full|sac activation checkpointing of every block: torch.utils.checkpoint, or the same with a
                   selective-checkpoint policy that saves matmuls and collectives (torchtitan's default)
--compile          each block's forward compiled (torch.compile, backend aot_eager)

Run: torchrun --nproc-per-node 2 tests/programs/framework_patterns.py --optim container --ac sac
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers). STEPS optimizer
steps of ACCUM microbatches each: prism must count STEPS iterations and STEPS x ACCUM microbatches.
"""

import argparse
import functools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

STEPS, ACCUM = 3, 2


def emit(name: str, rank: int, *values) -> None:
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


_SAVE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
         torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.all_gather_into_tensor.default,
         torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops._c10d_functional.wait_tensor.default}


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


class Block(nn.Module):
    def __init__(self, dim: int, ac: str) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.ac = ac

    def inner(self, x):
        return x + self.down(torch.relu(self.up(x)))

    def forward(self, x):
        if self.ac == "none":
            return self.inner(x)
        context = functools.partial(create_selective_checkpoint_contexts, _policy) if self.ac == "sac" else None
        kwargs = {"context_fn": context} if context else {}
        return checkpoint(self.inner, x, use_reentrant=False, **kwargs)


class Model(nn.Module):
    def __init__(self, ac: str, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(Block(dim, ac) for _ in range(layers))
        self.out = nn.Linear(dim, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class Container(torch.optim.Optimizer):
    """An optimizer of optimizers, as torchtitan's OptimizersContainer: its step() steps each inner one."""

    def __init__(self, optimizers) -> None:
        self.optimizers = optimizers
        super().__init__([p for o in optimizers for g in o.param_groups for p in g["params"]], {})
        self.param_groups = [g for o in optimizers for g in o.param_groups]  # schedulers see the inner groups

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optim", choices=["plain", "container", "several"], default="plain")
    parser.add_argument("--ac", choices=["none", "full", "sac"], default="none")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    rank, dp_rank = dist.get_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(0)
    model = Model(args.ac)
    for block in model.blocks:
        if args.tp > 1:
            parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if args.compile:
            block.compile(backend="aot_eager")
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    parts = [list(model.inp.parameters()) + list(model.blocks.parameters()), list(model.out.parameters())]
    optimizers = [torch.optim.AdamW(p, lr=1e-2) for p in parts]
    if args.optim == "plain":
        optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-2)]
    elif args.optim == "container":
        optimizers = [Container(optimizers)]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1.0 / (1 + step)) for o in optimizers]
    loss_fn = nn.MSELoss()  # a module outside the model: not a microbatch
    gen = torch.Generator().manual_seed(100 + dp_rank)  # the same batch within a TP group
    for step in range(STEPS):
        total = 0.0
        for _ in range(ACCUM):
            x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)
            loss = loss_fn(model(x), y) / ACCUM
            loss.backward()
            total += loss.item()
        for o in optimizers:
            o.step()
        for s in schedulers:
            s.step()
        for o in optimizers:
            o.zero_grad()
        emit(f"loss{step}", rank, f"{total:.12e}")
    emit("full", rank, checksum(p.full_tensor() for p in model.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
