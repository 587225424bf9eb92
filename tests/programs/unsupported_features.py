"""Framework features prism cannot carry, one per `--feature`, each as a real program would use it.

--feature premul_sum     an all_reduce with ReduceOp.PREMUL_SUM (FSDP2's gradient reduce-scatter with a
                         divide factor, NCCL only: gloo refuses it too)
--feature sparse         an all_reduce of a sparse COO tensor (DDP with sparse embedding gradients)
--feature backend        init_process_group on a backend prism does not intercept: one the program registers
--feature group_backend  a new_group on such a backend, after a default group on gloo, used in the loop
--feature unused_fake    a new_group on torch's "fake" backend that is never used (torchtitan's size-1 and
                         'batch' mesh dimensions): no error, the loop runs on the default group
--feature direct_gloo    a gloo process group built directly from its C++ class (`dist.ProcessGroupGloo`),
                         not through init_process_group/new_group: the interception never sees it
--feature rpc            torch.distributed.rpc (TensorPipe): its own transport, under no process group
--feature symm_mem_buffer  a symmetric memory buffer (`symm_mem.empty`, then `rendezvous` on the default group), as
                         a program using symmetric memory directly allocates one (CUDA only, every rank on its GPU)
--feature symm_mem_op    a symm_mem op with no decomposition into collectives (`one_shot_all_reduce`)

Run: torchrun --nproc-per-node 2 tests/programs/unsupported_features.py --feature sparse
Prints `iteration N` before each of its STEPS iterations (a training loop's first op is where the feature is
met), then `result done <rank>`.
"""

import argparse
import importlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem  # (--feature symm_mem_*; it defines torch.ops.symm_mem)

STEPS = 2


def emit(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def _own_backend(store, rank, size, timeout):
    """A backend of the program's own (stands for a vendor's plugin: MPI, UCC, ...): gloo underneath."""
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--feature", required=True,
                        choices=["premul_sum", "sparse", "backend", "group_backend", "unused_fake", "direct_gloo",
                                 "rpc", "symm_mem_buffer", "symm_mem_op"])
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.feature in ("backend", "group_backend"):
        dist.Backend.register_backend("own", _own_backend, devices=["cpu"])
    dist.init_process_group("own" if args.feature == "backend" else "gloo")
    group = dist.new_group(backend="own") if args.feature == "group_backend" else None
    if args.feature == "unused_fake":
        importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake" (torchtitan too)

        dist.new_group(backend="fake")
    direct = None
    if args.feature == "direct_gloo":
        store = dist.PrefixStore("direct/", dist.distributed_c10d._get_default_store())
        direct = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=60))
    if args.feature == "rpc":
        from torch.distributed import rpc

        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    for step in range(STEPS):
        emit(f"iteration {step}")
        x = torch.full((4,), float(rank + step + 1))
        if args.feature == "premul_sum":
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
        elif args.feature == "sparse":
            s = torch.sparse_coo_tensor([[rank]], [float(step + 1)], (world,))
            dist.all_reduce(s)
            x = s.to_dense()
        elif args.feature == "group_backend":
            dist.all_reduce(x, group=group)
        elif args.feature == "direct_gloo":
            direct.allreduce([x]).wait()
        elif args.feature == "rpc":
            from torch.distributed import rpc

            x = rpc.rpc_sync(f"worker{(rank + 1) % world}", torch.add, args=(x, 1))
        elif args.feature == "symm_mem_buffer":
            buf = symm_mem.empty(4, device=x.device)
            symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
            buf.copy_(x)
        elif args.feature == "symm_mem_op":
            x = torch.ops.symm_mem.one_shot_all_reduce(x, "sum", dist.group.WORLD.group_name)
        else:
            dist.all_reduce(x)
        emit(f"result x{step} {rank} {' '.join(f'{v:g}' for v in x.tolist())}")
    if args.feature == "rpc":
        from torch.distributed import rpc

        rpc.shutdown()
    emit(f"result done {rank}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
