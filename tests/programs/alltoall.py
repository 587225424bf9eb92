"""all_to_all_single with uneven splits, a batch_isend_irecv ring, and every c10d collective with async_op=True.

Run: torchrun --nproc-per-node 2 tests/programs/alltoall.py
Prints `result <name> <rank> <values...>` lines (deterministic; compared across launchers).
"""

import os
import warnings

import torch
import torch.distributed as dist


def emit(name: str, rank: int, *values) -> None:
    """One `result` line, written with a single write so concurrent ranks never interleave."""
    os.write(1, f"result {name} {rank} {' '.join(map(str, values))}\n".encode())


warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor & co. are deprecated


def values(*tensors) -> str:
    return " ".join(f"{v:.10e}" for t in tensors for v in t.reshape(-1).double().tolist())


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # all_to_all_single, uneven: rank r sends (r + d + 1) rows to rank d
    in_splits = [rank + d + 1 for d in range(world)]
    out_splits = [s + rank + 1 for s in range(world)]
    inp = torch.arange(sum(in_splits) * 3, dtype=torch.float32).reshape(-1, 3) + 100 * rank
    out = torch.empty(sum(out_splits), 3)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    emit("all_to_all_single.uneven", rank, values(out))
    out_even = torch.empty(4 * world)
    work = dist.all_to_all_single(out_even, torch.arange(4.0 * world) + 10 * rank, async_op=True)
    work.wait()
    emit("all_to_all_single.even_async", rank, values(out_even))
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * rank + d)) for d in range(world)])
    emit("all_to_all.list", rank, values(*outs))

    # a ring exchange with batch_isend_irecv, twice (the second reuses the coalescing path)
    for rnd in range(2):
        send = torch.arange(5, dtype=torch.float32) + 10 * rank + rnd
        recv = torch.empty(5)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        emit(f"batch_isend_irecv.ring{rnd}", rank, values(recv))
    # plain isend/irecv and send/recv
    if rank == 0:
        req = dist.isend(torch.tensor([1.5, 2.5]), 1)
        req.wait()
        got = torch.empty(3)
        dist.recv(got, 1)
    elif rank == 1:
        got = torch.empty(2)
        req = dist.irecv(got, 0)
        req.wait()
        dist.send(torch.tensor([7.0, 8.0, 9.0]), 0)
    if rank < 2:
        emit("send_recv", rank, values(got))
    # a recv from any source: rank 0 hears from every other rank, in whatever order they arrive
    if rank == 0:
        heard = {}
        for _ in range(world - 1):
            t = torch.empty(2)
            src = dist.recv(t)
            heard[src] = values(t)
        emit("recv_anysource", rank, *[f"{src}:{heard[src]}" for src in sorted(heard)])
    else:
        dist.send(torch.tensor([rank, rank * 1.5]), 0)

    # every collective asynchronously, waited afterwards
    t_bcast = torch.arange(4.0) + rank
    t_reduce = torch.arange(4.0) * (rank + 1)
    gather_out = [torch.empty(3) for _ in range(world)] if rank == 0 else None
    scatter_in = [torch.full((3,), float(d + 1)) for d in range(world)] if rank == 0 else None
    scatter_out = torch.empty(3)
    ag_out = [torch.empty(2) for _ in range(world)]
    agt_out = torch.empty(2 * world)
    rs_out = torch.empty(2)
    rst_out = torch.empty(2)
    ags_out = torch.empty(world)
    rss_out = torch.empty(1)
    ar = torch.arange(3.0) + rank
    works = [
        dist.broadcast(t_bcast, src=0, async_op=True),
        dist.reduce(t_reduce, dst=0, op=dist.ReduceOp.SUM, async_op=True),
        dist.gather(torch.full((3,), float(rank)), gather_out, dst=0, async_op=True),
        dist.scatter(scatter_out, scatter_in, src=0, async_op=True),
        dist.all_gather(ag_out, torch.tensor([rank, -rank], dtype=torch.float32), async_op=True),
        dist.all_gather_into_tensor(agt_out, torch.tensor([rank + 0.5, rank + 0.25]), async_op=True),
        dist.reduce_scatter(rs_out, [torch.full((2,), float(rank + d)) for d in range(world)], async_op=True),
        dist.reduce_scatter_tensor(rst_out, torch.arange(2.0 * world) * (rank + 1), async_op=True),
        dist.all_gather_single(ags_out, torch.tensor([rank * 3.0]), async_op=True),
        dist.reduce_scatter_single(rss_out, torch.arange(1.0 * world) + rank, async_op=True),
        dist.all_reduce(ar, op=dist.ReduceOp.MAX, async_op=True),
        dist.barrier(async_op=True),
    ]
    for work in works:
        work.wait()
    emit("broadcast", rank, values(t_bcast))
    if rank == 0:
        emit("reduce", rank, values(t_reduce))
        emit("gather", rank, values(*gather_out))
    emit("scatter", rank, values(scatter_out))
    emit("all_gather", rank, values(*ag_out))
    emit("all_gather_into_tensor", rank, values(agt_out))
    emit("reduce_scatter", rank, values(rs_out))
    emit("reduce_scatter_tensor", rank, values(rst_out))
    emit("all_gather_single", rank, values(ags_out))
    emit("reduce_scatter_single", rank, values(rss_out))
    emit("all_reduce_max", rank, values(ar))
    # a future's value, as DDP comm hooks read it (gloo's reduce_scatter works have no future)
    fut_t = torch.ones(2) * (rank + 1)
    fut = dist.all_reduce(fut_t, async_op=True).get_future()
    emit("all_reduce_future", rank, values(*fut.wait()))
    # futures waited together (torch.futures waits in C++)
    wa, wb = torch.ones(2) * (rank + 2), torch.ones(3) * (rank + 3)
    futs = [dist.all_reduce(wa, async_op=True).get_future(), dist.all_reduce(wb, async_op=True).get_future()]
    torch.futures.wait_all(futs)
    emit("wait_all", rank, values(wa, wb))
    wc = torch.ones(2) * (rank + 4)
    joined = torch.futures.collect_all([dist.all_reduce(wc, async_op=True).get_future()])
    joined.wait()
    emit("collect_all", rank, values(wc))
    # the list form of coalesced all_gather
    agc_out = [[torch.empty(2), torch.empty(1)] for _ in range(world)]  # [source rank][input]
    dist.all_gather_coalesced(agc_out, [torch.full((2,), rank + 0.5), torch.full((1,), -rank - 1.0)])
    emit("all_gather_coalesced", rank, values(*[t for per_rank in agc_out for t in per_rank]))
    # object collectives (pickled through broadcast / all_gather)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "sq": rank * rank})
    emit("all_gather_object", rank, *[f"{o['rank']}:{o['sq']}" for o in objs])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
