"""Async tensor parallelism as torchtitan runs it (`--parallelism.enable_async_tensor_parallel`), in public torch APIs:
a sequence-parallel TP MLP stack (activations sharded on the sequence dimension, Megatron-SP / torchtitan's TP plan)
whose all-gather + column-parallel matmul and row-parallel matmul + reduce-scatter are async TP's fused ops,
`torch.ops.symm_mem.fused_all_gather_matmul` and `fused_matmul_reduce_scatter`, trained with AdamW.

inductor's micro-pipeline TP pass (`torch._inductor.config._micro_pipeline_tp`) puts them into both halves of a
compiled joint graph: the fused ops have no autograd formula, the pass rewrites the forward and the backward graph
apart. Here each linear pair is a custom autograd.Function whose forward and backward call the ops that pass leaves
(forward: all-gather+matmul, then matmul+reduce-scatter; backward: the reverse), so eager and torch.compile
(backend aot_eager) runs have them where an inductor-compiled torchtitan step has them. Like torchtitan, the program
sets `_micro_pipeline_tp` and calls `enable_symm_mem_for_group` on the TP group (deprecated in torch 2.13, still
called by torchtitan 0.3.0).

--ops fused      the fused ops (torch has no CPU kernel for them: torchrun on CPU fails; prism's capture, slice and
                 emulate run them as torch's fallback decomposition through prism's collectives)
--ops unfused    the same model with functional collectives apart from the matmuls (all_gather_tensor then @, @ then
                 reduce_scatter_tensor): what the fused ops decompose into, and what torchrun runs on CPU
--compile        each block's forward (and so its backward) compiled with torch.compile, backend aot_eager
--device cuda    the model and data on cuda:(LOCAL_RANK mod the GPUs), the default group asked for as "nccl" (torchtitan's):
                 prism's capture and emulate put W ranks on one GPU (tests/gpu/test_async_tp_cuda.py)
--scaled         after each step, an fp8 head (no grad) through the scaled forms, fused_all_gather_scaled_matmul and
                 fused_scaled_matmul_reduce_scatter (unfused: the same gathers of the fp8 bytes and torch._scaled_mm)

Run: torchrun --nproc-per-node 2 tests/programs/async_tp.py --ops unfused
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers): each step's loss, then a
checksum of every rank's trained shards. STEPS optimizer steps, one microbatch each.
"""

import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed._symmetric_memory as symm_mem

STEPS, BATCH, SEQ, DIM, HIDDEN, BLOCKS = 3, 2, 8, 16, 32, 2
SEQ_DIM = 1  # activations [batch, sequence, dim], sharded on the sequence (torchtitan's Shard(1))
warnings.filterwarnings("ignore", category=FutureWarning)  # enable_symm_mem_for_group, the *_tensor funcols


def emit(name: str, rank: int, *values) -> None:
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def checksum(tensors) -> str:
    flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
    return f"{flat.sum().item():.12e} {flat.abs().sum().item():.12e} {flat.square().sum().item():.12e}"


def gather_matmul(x, w, group: str, fused: bool):
    """(all_gather(x) on the sequence, all_gather(x) @ w)."""
    if fused:
        full, (y,) = torch.ops.symm_mem.fused_all_gather_matmul(x, [w], SEQ_DIM, group)
        return full, y
    full = funcol.wait_tensor(funcol.all_gather_tensor(x, SEQ_DIM, group))
    return full, full @ w


def matmul_scatter(h, w, group: str, fused: bool):
    """reduce_scatter(h @ w) on the sequence."""
    if fused:
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(h, w, "sum", SEQ_DIM, group)
    return funcol.wait_tensor(funcol.reduce_scatter_tensor(h @ w, "sum", SEQ_DIM, group))


def _weight_grad(x, gy):
    return x.flatten(0, -2).t() @ gy.flatten(0, -2)


class ColumnParallel(torch.autograd.Function):
    """The column-parallel linear after a sequence-parallel region: all-gather + matmul forward, matmul +
    reduce-scatter backward (the input's gradient)."""

    @staticmethod
    def forward(ctx, x, w, group, fused):
        full, y = gather_matmul(x, w, group, fused)
        ctx.save_for_backward(full, w)
        ctx.group, ctx.fused = group, fused
        return y

    @staticmethod
    def backward(ctx, gy):
        full, w = ctx.saved_tensors
        # the first block's input needs no gradient: a compiled joint graph has no reduce-scatter for it
        gx = matmul_scatter(gy, w.t(), ctx.group, ctx.fused) if ctx.needs_input_grad[0] else None
        return gx, _weight_grad(full, gy), None, None


class RowParallel(torch.autograd.Function):
    """The row-parallel linear back into the sequence-parallel region: matmul + reduce-scatter forward, all-gather +
    matmul backward."""

    @staticmethod
    def forward(ctx, h, w, group, fused):
        ctx.save_for_backward(h, w)
        ctx.group, ctx.fused = group, fused
        return matmul_scatter(h, w, group, fused)

    @staticmethod
    def backward(ctx, gz):
        h, w = ctx.saved_tensors
        full, gh = gather_matmul(gz, w.t(), ctx.group, ctx.fused)
        return gh, _weight_grad(h, full), None, None


class Block(torch.nn.Module):
    """x + down(relu(up(rms_norm(x)))) on a sequence shard: up column-parallel (its columns), down row-parallel."""

    def __init__(self, up: torch.Tensor, down: torch.Tensor, group: str, fused: bool) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Parameter(up), torch.nn.Parameter(down)
        self.group, self.fused = group, fused

    def forward(self, x):
        normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        h = torch.relu(ColumnParallel.apply(normed, self.up, self.group, self.fused))
        return x + RowParallel.apply(h, self.down, self.group, self.fused)


class Model(torch.nn.Module):
    """BLOCKS blocks of one full model (the same at any W), this rank's shards of each."""

    def __init__(self, rank: int, world: int, group: str, fused: bool, compiled: bool) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        cols = slice(rank * HIDDEN // world, (rank + 1) * HIDDEN // world)
        blocks = []
        for _ in range(BLOCKS):
            up = torch.randn(DIM, HIDDEN, generator=gen) / DIM ** 0.5
            down = torch.randn(HIDDEN, DIM, generator=gen) / HIDDEN ** 0.5
            blocks.append(Block(up[:, cols].clone(), down[cols].clone(), group, fused))
            if compiled:  # torchtitan compiles each transformer block
                blocks[-1] = torch.compile(blocks[-1], backend="aot_eager")
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


def fp8_head(x, w, scale, group: str, fused: bool):
    """A no-grad fp8 probe of the scaled forms: (gather x) @ w, then the same through the matmul-reduce-scatter."""
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t().contiguous().t()
    wt8 = w.t().contiguous().to(torch.float8_e4m3fn).t().contiguous().t()
    if fused:
        _, (y,) = torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            x8, [w8], scale, [scale], SEQ_DIM, group, [None], [None], [torch.float32], [False])
        y8 = y.to(torch.float8_e4m3fn)
        z = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
            y8, wt8, scale, scale, "sum", SEQ_DIM, SEQ_DIM, group, list(y8.shape[:-1]) + [w.shape[0]],
            out_dtype=torch.float32)
        return y, z
    # gloo gathers no fp8: the bytes, viewed back (a gather moves bytes)
    full = funcol.wait_tensor(funcol.all_gather_tensor(x8.view(torch.uint8), SEQ_DIM, group)).view(x8.dtype)
    y = torch._scaled_mm(full.flatten(0, -2), w8, scale, scale, out_dtype=torch.float32).unflatten(0, full.shape[:-1])
    y8 = y.to(torch.float8_e4m3fn)
    prod = torch._scaled_mm(y8.flatten(0, -2), wt8, scale, scale, out_dtype=torch.float32).unflatten(0, y8.shape[:-1])
    return y, funcol.wait_tensor(funcol.reduce_scatter_tensor(prod, "sum", SEQ_DIM, group))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", choices=["fused", "unfused"], default="fused")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--scaled", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    fused = args.ops == "fused"
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD.group_name  # the TP group: every rank (TP = W)
    torch._inductor.config._micro_pipeline_tp = True  # what torchtitan's enable_async_tensor_parallel sets
    symm_mem.enable_symm_mem_for_group(group)
    assert symm_mem.is_symm_mem_enabled_for_group(group)
    model = Model(rank, world, group, fused, args.compile).to(device)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2)
    rows = slice(rank * SEQ // world, (rank + 1) * SEQ // world)
    for step in range(STEPS):
        data = torch.Generator().manual_seed(100 + step)
        x = torch.randn(BATCH, SEQ, DIM, generator=data)[:, rows].contiguous().to(device)  # this rank's shard
        out = model(x)
        loss = out.square().sum() / (BATCH * SEQ * DIM)  # this shard's part of the mean
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        emit(f"loss{step}", rank, f"{total.item():.9e}")
        if args.scaled:
            with torch.no_grad():
                y, z = fp8_head(out.detach(), params[0].detach(), torch.tensor(1.0, device=device), group, fused)
            emit(f"fp8_{step}", rank, checksum([y]), checksum([z]))
    emit("trained", rank, checksum(params))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
