"""How each collective writes its result, as autograd sees it: the version counter of the output tensor
right after the call returns and after its wait, for c10d ops (sync and async) and functional collectives.
Selective activation checkpointing caches op outputs with their version and refuses a changed one at
recomputation, so a backend that bumps a version later than gloo does breaks programs that run on gloo.

Run: torchrun --nproc-per-node 2 tests/programs/result_versions.py
Prints `result <name> <rank> <values...>` lines (compared across launchers).
"""

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc


def emit(name: str, rank: int, *values) -> None:
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    cases = {
        "all_reduce": lambda a: (t := torch.full((4,), rank + 1.0), dist.all_reduce(t, async_op=a))[::-1],
        "all_gather_into_tensor": lambda a: (t := torch.empty(4 * world),
                                             dist.all_gather_into_tensor(t, torch.ones(4) * rank, async_op=a))[::-1],
        "reduce_scatter_tensor": lambda a: (t := torch.empty(4),
                                            dist.reduce_scatter_tensor(t, torch.ones(4 * world), async_op=a))[::-1],
        "broadcast": lambda a: (t := torch.full((4,), float(rank)), dist.broadcast(t, 0, async_op=a))[::-1],
    }
    for name, call in cases.items():
        for async_op in (False, True):
            work, out = call(async_op)
            returned = out._version
            if work is not None:
                work.wait()
            emit(f"{name}-{'async' if async_op else 'sync'}", rank, returned, out._version, f"{out.sum().item():.6e}")
    functional = {
        "fc_all_reduce": lambda: fc.all_reduce(torch.full((4,), rank + 1.0), "sum", group),
        "fc_all_gather": lambda: fc.all_gather_tensor(torch.ones(4) * rank, 0, group),
        "fc_reduce_scatter": lambda: fc.reduce_scatter_tensor(torch.ones(4 * world), "sum", 0, group),
    }
    for name, call in functional.items():
        out = call()
        raw = out.elem if isinstance(out, fc.AsyncCollectiveTensor) else out
        returned = raw._version
        done = fc.wait_tensor(out) if isinstance(out, fc.AsyncCollectiveTensor) else out
        emit(name, rank, returned, raw._version, f"{done.sum().item():.6e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
