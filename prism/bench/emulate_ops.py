"""`prism bench emulate-ops`: one collective through the emulated sandbox's transport vs plain gloo.

W real processes on gloo (one TCP store). Per op kind and group shape, the time of one op on a sandbox
rank through `EmulateTransport` (the transport `prism emulate` gives a sandbox rank's groups: its
participants' gloo instance and, where it runs, the pruned protocol) against the same op, same members,
same tensors on a plain `ProcessGroupGloo` (the baseline, measured in the same run). Shapes: `sandbox`
(every member a sandbox rank: the EP group of dp8-ep4 in the W=8 device runs) and `sandbox+comp` (the
last member virtual: a compensator process runs its part of `pruned.run` with the same tensors as its
recorded contribution, as the replay worker does). Each op starts after a barrier of a third group;
the time is the call to the end of `wait()`, median over N ops and the sandbox ranks. Data-movement
ops' outputs are checked equal to the baseline's (the bench fails otherwise).

    prism bench emulate-ops [--world 4] [--n 40] [--ops a2a,all_reduce,...]

Sizes: the all-to-alls of `moe_gpt --dp 8 --ep 4` (token counts: int64[W]; tokens: ~256 rows x 128
float32 with uneven splits), 1 MiB float32 for the reductions/broadcast, 128 KiB per rank for all_gather.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.multiprocessing as mp
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions, BroadcastOptions,
                                        PrefixStore, ProcessGroupGloo, ReduceOp, ReduceScatterOptions, TCPStore)

from prism import settings
from prism.bench import text_table

OPS = ["a2a_counts", "a2a", "all_reduce", "all_gather", "reduce_scatter", "broadcast"]
SHAPES = ["sandbox", "sandbox+comp"]
TIMEOUT = timedelta(minutes=2)
HIDDEN = 128


def _rows(src: int, w: int) -> list[int]:
    """Uneven token splits of rank `src` (rows it sends to each rank), ~256 rows in all."""
    return [40 + (17 * src + 29 * d) % 50 for d in range(w)]


def case(name: str, rank: int, w: int) -> dict:
    """One op of rank `rank`: the event op, the transport method and its args (fresh outputs), the
    baseline's call, the contribution a compensator replays for this rank, outputs to compare."""
    g = torch.Generator().manual_seed(1000 + rank)
    if name in ("a2a_counts", "a2a"):
        if name == "a2a_counts":
            inp, ins, outs = torch.arange(w, dtype=torch.int64) + 10 * rank, [1] * w, [1] * w
        else:
            ins, outs = _rows(rank, w), [_rows(s, w)[rank] for s in range(w)]
            inp = torch.randn(sum(ins), HIDDEN, generator=g)
        out = torch.empty((sum(outs),) + tuple(inp.shape[1:]), dtype=inp.dtype)
        return dict(op="all_to_all_single", method="alltoall_base", args=(out, inp, outs, ins, AllToAllOptions()),
                    base=lambda pg, o: pg.alltoall_base(o, inp, outs, ins, AllToAllOptions()),
                    fresh=lambda: torch.empty_like(out), record=({"splits": ins}, [inp]), red=None, root=-1,
                    check=True)
    if name in ("all_reduce", "reduce_scatter"):
        inp = torch.randn(1 << 18, generator=g)
        opts = AllreduceOptions() if name == "all_reduce" else ReduceScatterOptions()
        opts.reduceOp = ReduceOp.SUM
        if name == "all_reduce":
            return dict(op="all_reduce", method="allreduce", fresh=lambda: inp.clone(), arg=lambda o: ([o], opts),
                        base=lambda pg, o: pg.allreduce([o], opts), record=({}, [inp]), red="SUM", root=-1,
                        check=False)
        out = torch.empty(inp.numel() // w)
        return dict(op="reduce_scatter_tensor", method="reduce_scatter_single", fresh=lambda: torch.empty_like(out),
                    arg=lambda o: (o, inp, opts), base=lambda pg, o: pg._reduce_scatter_base(o, inp, opts),
                    record=({}, [inp]), red="SUM", root=-1, check=False)
    if name == "all_gather":
        inp = torch.randn(1 << 15, generator=g)
        return dict(op="all_gather_into_tensor", method="all_gather_single", fresh=lambda: torch.empty(w * inp.numel()),
                    arg=lambda o: (o, inp, AllgatherOptions()),
                    base=lambda pg, o: pg._allgather_base(o, inp, AllgatherOptions()), record=({}, [inp]),
                    red=None, root=-1, check=True)
    if name == "broadcast":
        src = torch.randn(1 << 18, generator=torch.Generator().manual_seed(7))
        opts = BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        return dict(op="broadcast", method="broadcast",
                    fresh=lambda: src.clone() if rank == 0 else torch.empty_like(src), arg=lambda o: ([o], opts),
                    base=lambda pg, o: pg.broadcast([o], opts), record=({}, [src]), red=None, root=0, check=True)
    raise ValueError(f"unknown op {name!r} (ops: {', '.join(OPS)})")


def _args(c: dict, out):
    if "arg" in c:
        return c["arg"](out)
    o, i, outs, ins, opts = c["args"]
    return (out, i, outs, ins, opts)


def _worker(rank: int, w: int, port: int, ops: list[str], n: int, results) -> None:
    os.environ[settings.PRUNING.name] = "1"
    from prism.runtime.emulate import transport as emulate_transport
    from prism.runtime.emulate import pruned
    from prism.runtime.semantics import RedOp

    store = TCPStore("127.0.0.1", port, w, rank == 0, TIMEOUT)
    sync = ProcessGroupGloo(PrefixStore("bench-sync/", store), rank, w, TIMEOUT)
    base = ProcessGroupGloo(PrefixStore("bench-base/", store), rank, w, TIMEOUT)
    members = list(range(w))
    rows = []
    for shape in SHAPES:
        sandbox = members if shape == "sandbox" else members[:-1]
        os.environ[settings.SLICE_RANKS.name] = ",".join(map(str, sandbox))
        group = f"bench-{shape}"
        if rank in sandbox:
            tr = emulate_transport.EmulateTransport(store, group, rank, members, TIMEOUT)
        else:  # the compensator of the trailing virtual member, as the replay worker runs it
            parts = pruned.participants(members, set(sandbox))
            index = [i for i, (r, _) in enumerate(parts) if r == rank][0]
            pg = ProcessGroupGloo(PrefixStore("gloo/", emulate_transport.emu_store(group, store)), index, len(parts),
                                  TIMEOUT)
        for name in ops:
            c = case(name, rank, w)
            want = None
            times = {"emu": [], "base": []}
            for k in range(2 * n + 4):
                which = "emu" if k % 2 == 0 else "base"
                out = c["fresh"]()
                sync.barrier().wait()
                t0 = time.perf_counter()
                if which == "base":
                    c["base"](base, out).wait()
                elif rank in sandbox:
                    tr.call(c["method"], torch.device("cpu"), *_args(c, out), op=c["op"]).wait()
                else:
                    proto = pruned.Protocol(c["op"], members, set(sandbox), parts, c["root"])
                    wire = emulate_transport.GlooWire(pg)
                    own = {members.index(rank): (dict(c["record"][0], op=c["op"]), c["record"][1])}
                    pruned.run(proto, index, own, wire, getattr(RedOp, c["red"]) if c["red"] else None)
                    wire.flush()
                dt = time.perf_counter() - t0
                if k >= 4:
                    times[which].append(dt)
                if rank in sandbox and k == 0 and not _bitwise(out, expected(name, rank, w, out, c)):
                    raise AssertionError(f"{name} ({shape}) rank {rank}: emulated output differs from "
                                         + ("gloo's" if c["check"] else "semantics.reduce"))
                if k == 0:
                    want = out
                if rank in sandbox and c["check"] and k == 1 and not _bitwise(out, want):
                    raise AssertionError(f"{name} ({shape}) rank {rank}: gloo's output differs from prism's")
            if rank in sandbox:
                rows.append((shape, name, times["emu"], times["base"]))
    results.put((rank, rows))
    sync.barrier().wait()


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.numel() else a,
                                                                      b.view(torch.uint8) if b.numel() else b)


def expected(name: str, rank: int, w: int, out: torch.Tensor, c: dict) -> torch.Tensor:
    """What prism's semantics give member `rank` (every member's inputs rebuilt from `case`): the left
    fold in group order for reductions; for data movement the emulated output itself (compared with
    gloo's in the next op)."""
    from prism.runtime import semantics
    from prism.runtime.semantics import RedOp

    inputs = [case(name, r, w)["record"][1][0] for r in range(w)]
    if name == "all_reduce":
        return semantics.reduce(inputs, RedOp.SUM)
    if name == "reduce_scatter":
        return semantics.reduce_scatter_chunk(inputs, RedOp.SUM, rank, w).view_as(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(w: int, n: int, ops: list[str]) -> list[dict]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, w, port, ops, n, results)) for r in range(w)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(w):
            rank, rows = results.get(timeout=600)
            got[rank] = rows
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise RuntimeError(f"a bench process failed (exit codes {bad})")
    table = []
    for shape in SHAPES:
        for name in ops:
            emu = [t for rows in got.values() for s, o, e, _ in rows if (s, o) == (shape, name) for t in e]
            base = [t for rows in got.values() for s, o, _, b in rows if (s, o) == (shape, name) for t in b]
            if not emu:
                continue
            e, b = statistics.median(emu) * 1e3, statistics.median(base) * 1e3
            table.append({"shape": shape, "op": name, "emulated_ms": e, "gloo_ms": b, "ratio": e / b})
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="prism bench emulate-ops", description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--n", type=int, default=40, help="ops per (shape, op, side)")
    ap.add_argument("--ops", default=",".join(OPS))
    a = ap.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    for o in ops:
        if o not in OPS:
            ap.error(f"unknown op {o!r} (ops: {', '.join(OPS)})")
    if a.world < 2:
        ap.error("--world must be at least 2 (the sandbox+comp shape needs a virtual member)")
    torch.set_num_threads(1)
    started = time.monotonic()
    table = measure(a.world, a.n, ops)
    cols = [("shape", "<13", lambda r: r["shape"]), ("op", "<15", lambda r: r["op"]),
            ("emulated ms", "11.3f", lambda r: r["emulated_ms"]), ("gloo ms", "8.3f", lambda r: r["gloo_ms"]),
            ("emulated/gloo", "13.2f", lambda r: r["ratio"])]
    print(text_table.render(f"prism bench emulate-ops: W={a.world}, median of {a.n} ops per cell over the sandbox "
                            f"ranks ({time.monotonic() - started:.0f} s)", cols, table))
    return 0
