"""Every c10d collective and p2p op, sync and async, on CUDA tensors over NCCL (any W >= 1).

Run: torchrun --nproc-per-node W tests/gpu/programs/nccl_ops.py   (one GPU per rank where there are W GPUs,
else ranks share GPU 0: W=1 is the one-GPU case, NCCL groups of one member)
Prints `result <name> <rank> <values...>` lines (deterministic; compared across `--mode off` and prism).
Covers: the blocking API (NCCL returns no work: it synchronised the stream at the C++ level), async works
waited later, futures (`get_future`, as DDP uses), the coalescing manager, batch_isend_irecv (one NCCL work
for the batch), functional collectives, and a DDP step.
"""

import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

warnings.filterwarnings("ignore")


def emit(name: str, rank: int, *values) -> None:
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


def values(*tensors) -> str:
    return " ".join(f"{v:.10e}" for t in tensors for v in t.reshape(-1).double().cpu().tolist())


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    a = lambda *shape: torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32, device=dev).reshape(shape)

    for async_op in (False, True):
        s = "async" if async_op else "sync"

        def done(work):
            if async_op:
                work.wait()

        t = a(6) + rank
        done(dist.all_reduce(t, async_op=async_op))
        emit(f"all_reduce.{s}", rank, values(t))
        t = a(3) * (rank + 1)
        done(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=async_op))
        emit(f"all_reduce_max.{s}", rank, values(t))
        t = a(4) + 10 * rank
        done(dist.broadcast(t, src=world - 1, async_op=async_op))
        emit(f"broadcast.{s}", rank, values(t))
        t = a(4) * (rank + 2)
        done(dist.reduce(t, dst=0, async_op=async_op))
        if rank == 0:
            emit(f"reduce.{s}", rank, values(t))
        outs = [torch.empty(3, device=dev) for _ in range(world)]
        done(dist.all_gather(outs, a(3) + 100 * rank, async_op=async_op))
        emit(f"all_gather.{s}", rank, values(*outs))
        out = torch.empty(2 * world, device=dev)
        done(dist.all_gather_into_tensor(out, a(2) + rank, async_op=async_op))
        emit(f"all_gather_into_tensor.{s}", rank, values(out))
        out = torch.empty(2, device=dev)
        done(dist.reduce_scatter(out, [a(2) + rank + d for d in range(world)], async_op=async_op))
        emit(f"reduce_scatter.{s}", rank, values(out))
        out = torch.empty(3, device=dev)
        done(dist.reduce_scatter_tensor(out, a(3 * world) * (rank + 1), async_op=async_op))
        emit(f"reduce_scatter_tensor.{s}", rank, values(out))
        out = torch.empty(2 * world, device=dev)
        done(dist.all_to_all_single(out, a(2 * world) + 10 * rank, async_op=async_op))
        emit(f"all_to_all_single.{s}", rank, values(out))
        outs = [torch.empty(2, device=dev) for _ in range(world)]
        done(dist.all_to_all(outs, [torch.full((2,), float(10 * rank + d), device=dev) for d in range(world)],
                             async_op=async_op))
        emit(f"all_to_all.{s}", rank, values(*outs))
        gather_out = [torch.empty(3, device=dev) for _ in range(world)] if rank == 0 else None
        done(dist.gather(a(3) + rank, gather_out, dst=0, async_op=async_op))
        if rank == 0:
            emit(f"gather.{s}", rank, values(*gather_out))
        out = torch.empty(2, device=dev)
        scatter_in = [a(2) + 7 * d for d in range(world)] if rank == 0 else None
        done(dist.scatter(out, scatter_in, src=0, async_op=async_op))
        emit(f"scatter.{s}", rank, values(out))
        done(dist.barrier(async_op=async_op))

        # a future, as DDP consumes its buckets
        t = a(5) + rank
        work = dist.all_reduce(t, async_op=True)
        got = work.get_future().wait()
        emit(f"all_reduce_future.{s}", rank, values(*got))

        # the coalescing manager (fast path: one allreduce_coalesced)
        ts = [a(2) + rank, a(3) * (rank + 1)]
        with dist._coalescing_manager(device=dev, async_ops=async_op) as cm:
            for x in ts:
                dist.all_reduce(x)
        if async_op:
            cm.wait()
        emit(f"coalesced_all_reduce.{s}", rank, values(*ts))

        if world > 1:
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            send, recv = a(5) + 10 * rank, torch.empty(5, device=dev)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])
            for req in reqs:
                req.wait()
            emit(f"batch_isend_irecv.{s}", rank, values(recv))
            got = torch.empty(3, device=dev)
            if rank % 2 == 0:
                if async_op:
                    dist.isend(a(3) + rank, nxt).wait()
                    dist.irecv(got, prv).wait()
                else:
                    dist.send(a(3) + rank, nxt)
                    dist.recv(got, prv)
            else:
                if async_op:
                    dist.irecv(got, prv).wait()
                    dist.isend(a(3) + rank, nxt).wait()
                else:
                    dist.recv(got, prv)
                    dist.send(a(3) + rank, nxt)
            emit(f"send_recv.{s}", rank, values(got))

    # functional collectives (compiled programs use these)
    t = funcol.all_reduce(a(4) + rank, "sum", dist.group.WORLD)
    emit("funcol.all_reduce", rank, values(t))
    t = funcol.all_gather_tensor(a(2) + rank, 0, dist.group.WORLD)
    emit("funcol.all_gather_tensor", rank, values(t))
    t = funcol.reduce_scatter_tensor(a(2 * world) + rank, "sum", 0, dist.group.WORLD)
    emit("funcol.reduce_scatter_tensor", rank, values(t))

    # a DDP step (broadcast at construction, bucketed all-reduce through futures)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index], bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=g).to(dev)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    emit("ddp.params", rank, values(*[p.detach() for p in model.parameters()]))
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
