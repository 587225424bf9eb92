"""Functional collectives (`torch.distributed._functional_collectives`), eager and under `torch.compile`.

Run: torchrun --nproc-per-node 2 tests/programs/functional.py [--compile aot_eager,inductor]
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def values(t: torch.Tensor) -> str:
    return " ".join(f"{v:.10e}" for v in t.reshape(-1).double().tolist())


warnings.filterwarnings("ignore", category=FutureWarning)  # the older funcol names are deprecated


def compiled_step(x: torch.Tensor, group) -> torch.Tensor:
    y = torch.sin(x) * 2 + 1
    y = funcol.all_reduce(y, "sum", group)
    return funcol.wait_tensor(y) / 3 + x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", default="aot_eager,inductor",
                        help="torch.compile backends to run the compiled step with (comma-separated)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    base = torch.arange(8, dtype=torch.float32) + 10 * rank  # 8 elements: divisible by the world size

    # eager: async tensors, waited explicitly or on first use
    ar = funcol.all_reduce(base.clone(), "sum", group)
    emit("eager.all_reduce", rank, values(funcol.wait_tensor(ar)))
    ag = funcol.all_gather_tensor(base[:4].clone(), 0, group)
    emit("eager.all_gather_tensor", rank, values(funcol.wait_tensor(ag)))
    rs = funcol.reduce_scatter_tensor(base.clone() * (rank + 1), "sum", 0, group)
    emit("eager.reduce_scatter_tensor", rank, values(funcol.wait_tensor(rs)))
    rs_avg = funcol.reduce_scatter_tensor(base.clone(), "avg", 0, group)
    emit("eager.reduce_scatter_avg", rank, values(rs_avg + 0))  # waited on first use
    ag_list = funcol.all_gather_into_tensor_coalesced([base[:2].clone(), base[2:6].clone()], group)
    emit("eager.all_gather_coalesced", rank, " ".join(values(funcol.wait_tensor(t)) for t in ag_list))
    rs_list = funcol.reduce_scatter_tensor_coalesced([base.clone(), base[:4].clone() * 3], "sum", [0, 0],
                                                     group)
    emit("eager.reduce_scatter_coalesced", rank, " ".join(values(funcol.wait_tensor(t)) for t in rs_list))
    ars = funcol.all_reduce_coalesced([base[:3].clone(), base[3:].clone()], "max", group)
    emit("eager.all_reduce_coalesced", rank, " ".join(values(funcol.wait_tensor(t)) for t in ars))
    splits = [8 // world] * world
    a2a = funcol.all_to_all_single(base.clone(), splits, splits, group)
    emit("eager.all_to_all_single", rank, values(funcol.wait_tensor(a2a)))
    bc = funcol.broadcast(base.clone(), 0, group)
    emit("eager.broadcast", rank, values(funcol.wait_tensor(bc)))

    # the same all_reduce in a compiled function: Dynamo traces the functional collective into the graph
    for backend in args.compile.split(","):
        compiled = torch.compile(compiled_step, backend=backend, fullgraph=True)
        for step in range(2):
            out = compiled(base + step + 0.5, group)
            emit(f"compiled.{backend}{step}", rank, values(out))
        ref = compiled_step(base + 1.5, group)
        emit(f"compiled.{backend}_vs_eager", rank, f"{(out - ref).abs().max().item():.3e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
