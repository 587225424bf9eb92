"""`scripts/replay_ring.py --burst` (session 17, issue 24): the runtime's neighbours ring against gloo's own ring
all-reduce of N real processes, bursts of async all-reduces; the processes of a row and its table. See
`scripts/replay_ring.py`'s docstring for the options; this module is that script's `--burst` half (its processes
are started as `python scripts/replay_ring_burst.py --burst-proc SPEC`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta


def gather(children: list[subprocess.Popen], row: dict, take, what: str) -> None:
    """Wait for each child (300 s at most, then killed: row["error"]), `take` each JSON line it printed; a child
    exiting non-zero sets row["error"] naming `what` it was."""
    for p in children:
        try:
            out, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            row["error"] = "timed out"
        for line in (out or "").splitlines():
            take(json.loads(line))
        if p.returncode:
            row["error"] = f"{what} exited {p.returncode}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _thread_ns() -> dict[str, int]:
    """CPU ns per kind of thread of this process (schedstat's run time; named as `prism.runtime.thread_cpu`)."""
    import threading as th

    from prism.runtime.thread_cpu import _comm, kind

    named = {t.native_id: kind(t.name) for t in th.enumerate() if t.native_id is not None}
    out: dict[str, int] = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                ns = int(fh.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        name = "MainThread" if tid == os.getpid() else named.get(tid) or f"[{_comm(tid)}]"
        out[name] = out.get(name, 0) + ns
    return out


def _cpu_per_op(before: dict[str, int], after: dict[str, int], ops: int) -> dict[str, float]:
    """us of CPU per op per kind of thread, between two `_thread_ns` (threads started between them count whole)."""
    return {k: round((v - before.get(k, 0)) / 1e3 / ops, 1) for k, v in sorted(after.items())
            if v - before.get(k, 0) > 0}


def _burst_report(who: str, walls: list[float], burst: int, cpu: dict[str, float], extra: dict) -> None:
    walls = walls[1:] if len(walls) > 2 else walls  # (the first burst connects the pairs)
    per_op = [w / burst * 1e6 for w in walls]
    print(json.dumps({"who": who, "op_us": round(statistics.median(per_op), 1), "op_us_min": round(min(per_op), 1),
                      "op_us_max": round(max(per_op), 1), "cpu_us_per_op": cpu,
                      "cpu_us_per_op_total": round(sum(cpu.values()), 1), **extra}), flush=True)


def _drain(works, main: str) -> None:
    """The rank's main thread until a burst's ops complete: `wait` (blocked in each op's wait, the GIL released),
    `torch` (a loop of small torch ops, as a program computing while its all-reduces run: each op releases the
    GIL for its kernel), `python` (a pure Python loop: the GIL is released only at the switch interval)."""
    if main == "wait":
        for w in works:
            w.wait()
        return
    import torch

    a, b = torch.ones(256), torch.ones(256)
    while not all(w.is_completed() for w in works):
        if main == "torch":
            for _ in range(8):
                torch.add(a, b, out=b)
        else:
            sum(range(200))
    for w in works:
        w.wait()


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "int32": torch.int32, "int64": torch.int64}[name]


def burst_gloo(port: int, n: int, rank: int, cores: list[int], nbytes: int, burst: int, bursts: int,
               dtype: str, main: str = "wait") -> None:
    """`--burst`, gloo's layout: member `rank` of N real processes, `burst` async all-reduces then wait all."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False, timeout=timeout)
    pg = ProcessGroupGloo(PrefixStore("ring/", store), rank, n, timeout)
    dt = _dtype(dtype)
    numel = max(1, nbytes // torch.empty(0, dtype=dt).element_size())
    bufs = [torch.ones(numel, dtype=dt) for _ in range(burst)]
    walls = []
    pg.barrier().wait()
    c0 = _thread_ns()
    for _ in range(bursts):
        pg.barrier().wait()
        for b in bufs:
            b.fill_(1)
        t0 = time.perf_counter()
        works = [pg.allreduce([b]) for b in bufs]
        _drain(works, main)
        walls.append(time.perf_counter() - t0)
    cpu = _cpu_per_op(c0, _thread_ns(), burst * bursts)
    if not all(torch.equal(b, torch.full_like(b, n)) for b in bufs):
        raise SystemExit(f"gloo member {rank}: not the sum")
    pg.barrier().wait()
    _burst_report(f"gloo{rank}", walls, burst, cpu, {})


def burst_slice(port: int, n: int, live: list[int], pos: int, cores: list[int], nbytes: int, burst: int,
                bursts: int, dtype: str, main: str = "wait") -> None:
    """`--burst`, the ring's layout, a slice rank: the runtime's `LiveRing` at ring position `pos`."""
    import torch
    import torch.distributed as dist

    from prism.runtime import semantics
    from prism.runtime.slice import ring

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timeout)
    lr = ring.LiveRing(store, list(range(n)), set(live), pos, timeout, "micro")
    dt = _dtype(dtype)
    numel = max(1, nbytes // torch.empty(0, dtype=dt).element_size())
    bufs = [torch.ones(numel, dtype=dt) for _ in range(burst)]

    class _Opts:
        reduceOp = dist.ReduceOp.SUM

    opts = _Opts()
    assert semantics.red_op(opts) == semantics.RedOp.SUM
    walls = []
    lr.pg.barrier().wait()
    c0 = _thread_ns()
    for _ in range(bursts):
        lr.pg.barrier().wait()
        for b in bufs:
            b.fill_(1)
        t0 = time.perf_counter()
        works = [lr.allreduce([b], opts) for b in bufs]
        _drain(works, main)
        walls.append(time.perf_counter() - t0)
    cpu = _cpu_per_op(c0, _thread_ns(), burst * bursts)
    if ring.exact(dt) and not all(torch.equal(b, torch.full_like(b, n)) for b in bufs):
        raise SystemExit(f"slice rank at position {pos}: not the exact sum")
    lr.pg.barrier().wait()
    _burst_report(f"slice{pos}", walls, burst, cpu, {})


def burst_server(port: int, n: int, live: list[int], cores: list[int], nbytes: int, burst: int, bursts: int,
                 dtype: str, queue: bool = False) -> None:
    """`--burst`, the ring's layout, the replay server's end: `ring.play` per op, `GLOO_THREADS` at once, in
    issue order, as `ReplayServer._ring_group` runs them (its main thread hands an op to a pool thread once a
    slot is free). `queue` (`--server-queue`, an experiment): every op of a burst handed to the pool at once, so
    a pool thread that ends an op starts the next without the main thread's hand-off."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import torch.distributed as dist

    from prism.runtime import semantics
    from prism.runtime.slice import ring

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timeout)
    pg = ring.ring_group(store, len(live), len(live) + 1, timeout)
    dt = _dtype(dtype)
    numel = max(1, nbytes // torch.empty(0, dtype=dt).element_size())
    template = torch.ones(numel, dtype=dt)
    contributions = {p: template for p in range(n)} if ring.exact(dt) else None
    slots = threading.Semaphore(burst if queue else ring.GLOO_THREADS)

    def played(tag: int) -> None:
        try:
            ring.play(pg, n, live, tag, template, semantics.RedOp.SUM, contributions)
        finally:
            slots.release()

    tag = 0
    pg.barrier().wait()
    c0 = _thread_ns()
    w0 = time.perf_counter()
    with ThreadPoolExecutor(ring.GLOO_THREADS, thread_name_prefix="prism-ring-server-g") as pool:
        for _ in range(bursts):
            pg.barrier().wait()
            running = []
            for _ in range(burst):
                slots.acquire()
                running.append(pool.submit(played, tag))
                tag += 1
            for f in running:
                f.result()
        cpu = _cpu_per_op(c0, _thread_ns(), burst * bursts)
    wall = time.perf_counter() - w0
    pg.barrier().wait()
    print(json.dumps({"who": "server", "cpu_us_per_op": cpu, "cpu_us_per_op_total": round(sum(cpu.values()), 1),
                      "wall_us_per_op": round(wall / (burst * bursts) * 1e6, 1)}), flush=True)


def burst_one(layout: str, n: int, live: list[int], nbytes: int, burst: int, bursts: int, cores: list[int],
              server_cores: list[int], dtype: str, gloo_cores: list[int] | None = None, queue: bool = False,
              main: str = "wait") -> dict:
    """One `--burst` row: `layout` "gloo" (N processes), "ring" (the slice ranks at `live` and the server) or
    "ring16" (session 16's steps: since the session-17 revert the same as "ring")."""
    port = _free_port()
    me = [sys.executable, __file__, "--burst-proc"]
    common = {"port": port, "n": n, "bytes": nbytes, "burst": burst, "bursts": bursts, "dtype": dtype, "live": live,
              "main": main}
    if layout == "gloo":
        cores = gloo_cores or cores
        specs = [dict(common, role="gloo", rank=r, cores=[cores[r % len(cores)]]) for r in range(n)]
    else:
        specs = [dict(common, role="server", cores=server_cores, queue=queue)]
        specs += [dict(common, role="slice", pos=p, cores=[cores[i % len(cores)]]) for i, p in enumerate(live)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    children = [subprocess.Popen(me + [json.dumps(s)], stdout=subprocess.PIPE, text=True, env=env) for s in specs]
    row: dict = {"layout": layout, "main": main, "server_queue": queue if layout != "gloo" else None, "members": n,
                 "live": live if layout != "gloo" else None, "bytes": nbytes,
                 "dtype": dtype, "burst": burst, "bursts": bursts, "cores": cores, "server_cores":
                 server_cores if layout != "gloo" else None}
    gather(children, row, lambda d: row.__setitem__(d.pop("who"), d), "a process")
    ranks = [v for k, v in row.items() if isinstance(v, dict) and (k.startswith("gloo") or k.startswith("slice"))]
    if ranks:
        row["op_us"] = round(max(r["op_us"] for r in ranks), 1)  # (the slowest rank's burst: the group's)
        row["rank_cpu_us_per_op"] = round(statistics.mean(r["cpu_us_per_op_total"] for r in ranks), 1)
    return row


def burst_table(rows: list[dict]) -> str:
    """The ring against gloo: rows in run order, a round from each gloo row to the next; per round and layout the
    op's wall (the slowest rank's median burst / ops), its ratio to that round's gloo, the CPU per op of a rank
    (mean over the slice ranks / gloo's members) and of the server; then the threads of the last layout's."""
    rounds: list[dict] = []
    for r in rows:
        if r["layout"] == "gloo" or not rounds:
            rounds.append({})
        rounds[-1][r["layout"]] = r
    layouts = [x for x in ("ring16", "ring") if any(x in d for d in rounds)]
    head = ["repeat", "gloo op us"] + [f"{x} op us (/ gloo)" for x in layouts] + ["gloo CPU us/op/rank"] + \
        [f"{x} CPU us/op/slice rank, server" for x in layouts] + [f"{layouts[-1]}: a slice rank's threads us/op",
                                                                   f"{layouts[-1]}: the server's threads us/op"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {x: [] for x in layouts}

    def threads(d: dict) -> str:
        return ", ".join(f"{k} {v:.0f}" for k, v in d.get("cpu_us_per_op", {}).items() if v >= 1)

    for i, d in enumerate(rounds):
        g = d.get("gloo", {})
        cells = [str(i), str(g.get("op_us", g.get("error", "-")))]
        for x in layouts:
            r = d.get(x, {})
            if "op_us" in r and "op_us" in g:
                ratios[x].append(r["op_us"] / g["op_us"])
                cells.append(f"{r['op_us']} ({ratios[x][-1]:.2f})")
            else:
                cells.append(str(r.get("op_us", r.get("error", "-"))))
        cells.append(str(g.get("rank_cpu_us_per_op", "-")))
        for x in layouts:
            r = d.get(x, {})
            cells.append(f"{r.get('rank_cpu_us_per_op', '-')}, {r.get('server', {}).get('cpu_us_per_op_total', '-')}")
        last = d.get(layouts[-1], {})
        s0 = next((v for k, v in last.items() if k.startswith("slice") and isinstance(v, dict)), {})
        cells += [threads(s0), threads(last.get("server", {}))]
        lines.append("| " + " | ".join(cells) + " |")
    for x in layouts:
        if ratios[x]:
            v = ratios[x]
            lines.append(f"\n{x} / gloo: median {statistics.median(v):.2f} over {len(v)} rounds "
                         f"(min {min(v):.2f}, max {max(v):.2f})")
    return "\n".join(lines)


def proc_main(argv: list[str]) -> int:
    """One process of a `--burst` row: `--burst-proc SPEC` (a JSON spec: its role gloo, slice or server)."""
    s = json.loads(argv[1])
    a = (s["port"], s["n"])
    rest = (s["bytes"], s["burst"], s["bursts"], s["dtype"])
    if s["role"] == "gloo":
        burst_gloo(*a, s["rank"], s["cores"], *rest, s.get("main", "wait"))
    elif s["role"] == "slice":
        burst_slice(*a, s["live"], s["pos"], s["cores"], *rest, s.get("main", "wait"))
    else:
        burst_server(*a, s["live"], s["cores"], *rest, s.get("queue", False))
    return 0


if __name__ == "__main__":
    sys.exit(proc_main(sys.argv[1:]))
