"""A gloo all-reduce of N members laid out as a slice run lays out a DP group, against the real job's layout.

    .venv/bin/python scripts/replay_ring.py --members 4,16,32 --bytes 4,12928 --server-cores 1 [--out FILE.jsonl]
    .venv/bin/python scripts/replay_ring.py --members 16 --bytes 12928 --procs --cores 0-15   # the job's layout
    .venv/bin/python scripts/replay_ring.py --members 4,8,16,32 --bytes 12928 --neighbours   # the ring's two ends

`server` layout (default): member 0 is one process pinned to core 0 (a slice rank); members 1..N-1 are
`ProcessGroupGloo` instances in one other process (the replay server's layout: one instance per virtual member,
each all-reduce issued on all of them before any is waited), pinned to `--server-cores`. `--procs`: N processes,
member i pinned to the i-th of `--cores` (the real job, one rank a core). Member 0 times each all-reduce (a
barrier-free start: every member issues as soon as it can) and prints the median; the server also prints its
CPU and wall per all-reduce and its threads' run-queue wait (schedstat). Sizes as the weak layout's gradient
buckets (12,928 B: the DP group's bucket, docs/benchmarks.md session 11) and a 4-byte one.

`--neighbours` (session 12, option (b) of the brief): the prototype of a server that plays only member 0's two
ring neighbours. Member 0 and the server share a 2-member gloo group; member 0 runs an N-member ring all-reduce
itself (N-1 reduce-scatter steps, N-1 all-gather steps, each a send of one S/N chunk "to member 1" and a receive
of one S/N chunk "from member N-1", both with the server); the server sends what member N-1 would send at each
step (partial sums it computes from the known contributions) and takes what member 0 sends. It paces itself as a
symmetric ring does: member N-1's chunk j leaves once member 0's chunk j-1 has arrived, so a step costs one hop
as in the real ring. The server's work per all-reduce is 2(N-1) messages of S/N (O(S) bytes) instead of
(N-1) x 2(N-1) ring steps; member 0 checks its result against the exact sum.

`--burst` (session 17, issue 24): the runtime's neighbours ring (`prism.runtime.slice.ring`: `LiveRing` on the
slice ranks, `play` on the server, `GLOO_THREADS` ops at once on both sides, as the replay server runs them)
against gloo's own ring all-reduce of N real processes, in the same run: bursts of `--burst` async
all-reduces (DDP's buckets), a barrier between bursts, both layouts interleaved `--repeats` times. The slice
ranks are the ring positions `--live` (default 0,1: an EDP group of dp16-ep4 in a slice of 8, two real and two
virtual members), one process each on `--cores` in turn; the server on `--server-cores`; gloo's member i on the
i-th of `--gloo-cores` (cycled; default `--cores`). Each process prints its burst's wall per op (first issue to last completion / ops,
the median over bursts) and its threads' CPU per op (schedstat run time, by thread kind); `--table` prints the
ring against gloo. `--dtype int32`: the server plays the exact sums and each slice rank checks its result.
`--layouts gloo,ring16,ring`: ring16 was session 16's ring steps beside session 17's change, in the same round; since that change was reverted both run the runtime's steps (kept for the committed rows' layout names);
`--main torch|python`: a rank's main thread busy while its burst runs; `--server-queue`: an experiment (the
server's ops handed to its pool at once); `--table-from ROWS.jsonl`: the table of saved rows.

    .venv/bin/python scripts/replay_ring.py --burst --members 4 --live 0,1 --bytes 262144 --cores 0-1 --server-cores 1 --repeats 3 --table
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta

import replay_ring_burst as burst
from replay_ring_burst import _free_port, burst_one, burst_table, gather


def _cores(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def _runq_s() -> float:
    total = 0
    for f in glob.glob("/proc/self/task/*/schedstat"):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def member(port: int, n: int, ranks: list[int], cores: list[int], nbytes: int, reps: int, master: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False, timeout=timeout)
    pgs: dict[int, object] = {}
    keep = []

    def make(r: int) -> None:  # a store client each: the members' rendezvous run at once
        st = store if len(ranks) == 1 else dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                                         timeout=timeout)
        keep.append(st)
        pgs[r] = ProcessGroupGloo(PrefixStore("ring/", st), r, n, timeout)

    threads = [threading.Thread(target=make, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    numel = max(1, nbytes // 4)
    times = []
    c0, w0, q0 = sum(os.times()[:2]), time.perf_counter(), _runq_s()
    for _ in range(reps):
        t0 = time.perf_counter()
        works = [pgs[r].allreduce([torch.ones(numel)]) for r in ranks]
        for w in works:
            w.wait()
        times.append(time.perf_counter() - t0)
    cpu, wall, runq = sum(os.times()[:2]) - c0, time.perf_counter() - w0, _runq_s() - q0
    for w in [pgs[r].barrier() for r in ranks]:  # every member's: none leaves while another still reduces
        w.wait()
    if 0 in ranks:
        times = times[2:]
        print(json.dumps({"who": "member0", "median_ms": round(statistics.median(times) * 1e3, 3),
                          "min_ms": round(min(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3)}), flush=True)
    elif len(ranks) > 1:
        print(json.dumps({"who": "server", "members": len(ranks), "cpu_ms_per_op": round(cpu / reps * 1e3, 2),
                          "wall_ms_per_op": round(wall / reps * 1e3, 2), "runq_ms_per_op": round(runq / reps * 1e3, 2),
                          "threads": len(os.listdir("/proc/self/task"))}), flush=True)


def _chunks(t, n: int) -> list:
    """The ring's N chunks of a flat tensor (gloo's split: the first ones one element longer)."""
    import torch

    return list(torch.tensor_split(t, n))


def neighbours(port: int, n: int, cores: list[int], nbytes: int, reps: int, live: bool) -> None:
    """`--neighbours`: member 0 (live) runs the N-ring itself with the server, which plays members 1 and N-1."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)
    timeout = timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, is_master=live, wait_for_workers=False, timeout=timeout)
    pg = ProcessGroupGloo(PrefixStore("ring/", store), 0 if live else 1, 2, timeout)
    numel = max(1, nbytes // 4)
    steps = 2 * (n - 1)
    TO_RIGHT, FROM_LEFT = 0, 1  # tags: member 0 -> member 1, member N-1 -> member 0
    times = []
    c0, w0, q0 = sum(os.times()[:2]), time.perf_counter(), _runq_s()
    if live:
        want = torch.full((numel,), float(n))
        for _ in range(reps):
            t0 = time.perf_counter()
            buf = torch.ones(numel)
            ch = _chunks(buf, n)
            for j in range(steps):  # rank 0's ring: reduce-scatter, then all-gather
                if j < n - 1:
                    out, into = ch[(0 - j) % n], ch[(0 - j - 1) % n]
                else:
                    k = j - (n - 1)
                    out, into = ch[(1 - k) % n], ch[(0 - k) % n]
                tmp = torch.empty_like(into)
                r = pg.recv([tmp], 1, FROM_LEFT)
                s_ = pg.send([out], 1, TO_RIGHT)
                r.wait()
                if j < n - 1:
                    into.add_(tmp)
                else:
                    into.copy_(tmp)
                s_.wait()
            times.append(time.perf_counter() - t0)
            if not torch.equal(buf, want):
                raise SystemExit(f"member 0's result differs from the sum: {buf[:4]} (want {n})")
    else:
        contrib = torch.ones(numel)  # every member's contribution (the server knows them all)
        parts = _chunks(contrib, n)
        for _ in range(reps):
            # what member N-1 sends member 0 at each step: its reduce-scatter partial sums, then the sums
            plays = []
            for j in range(steps):
                if j < n - 1:
                    c = (n - 1 - j) % n  # chunk member N-1 sends at step j: sum over members N-1-j .. N-1
                    acc = parts[c].clone()
                    for _m in range(j):
                        acc.add_(parts[c])
                else:
                    k = j - (n - 1)
                    acc = parts[(n - k) % n] * n
                plays.append(acc)
            sinks = [torch.empty_like(parts[(0 - j) % n] if j < n - 1 else parts[(1 - (j - n + 1)) % n])
                     for j in range(steps)]
            sends = [pg.send([plays[0]], 0, FROM_LEFT)]
            for j in range(steps):
                pg.recv([sinks[j]], 0, TO_RIGHT).wait()
                if j + 1 < steps:
                    sends.append(pg.send([plays[j + 1]], 0, FROM_LEFT))
            for w in sends:
                w.wait()
    cpu, wall, runq = sum(os.times()[:2]) - c0, time.perf_counter() - w0, _runq_s() - q0
    pg.barrier().wait()
    if live:
        times = times[2:]
        print(json.dumps({"who": "member0", "median_ms": round(statistics.median(times) * 1e3, 3),
                          "min_ms": round(min(times) * 1e3, 3), "max_ms": round(max(times) * 1e3, 3)}), flush=True)
    else:
        print(json.dumps({"who": "server", "members": n - 1, "cpu_ms_per_op": round(cpu / reps * 1e3, 2),
                          "wall_ms_per_op": round(wall / reps * 1e3, 2), "runq_ms_per_op": round(runq / reps * 1e3, 2),
                          "threads": len(os.listdir("/proc/self/task"))}), flush=True)


def one(n: int, nbytes: int, reps: int, procs: bool, cores: list[int], server_cores: list[int],
        neigh: bool = False) -> dict:
    port = _free_port()
    me = [sys.executable, __file__, "--neighbour" if neigh else "--member"]
    if procs:
        layout = [([r], [cores[r % len(cores)]]) for r in range(n)]
    else:
        layout = [([0], [cores[0]]), (list(range(1, n)), server_cores)]
    children = []
    for i, (ranks, cs) in enumerate(layout):
        spec = json.dumps({"port": port, "n": n, "ranks": ranks, "cores": cs, "bytes": nbytes, "reps": reps,
                           "master": i == 0})
        children.append(subprocess.Popen(me + [spec], stdout=subprocess.PIPE, text=True))
    row = {"layout": "procs" if procs else "neighbours" if neigh else "server", "members": n, "bytes": nbytes, "reps": reps,
           "cores": cores[:1] if not procs else cores[:n], "server_cores": None if procs else server_cores}

    def take(d: dict) -> None:
        who = d.pop("who")
        row.update({f"{who}_{k}": v for k, v in d.items()})

    gather(children, row, take, "a member")
    if "member0_median_ms" in row:
        row["per_step_us"] = round(row["member0_median_ms"] * 1e3 / (2 * (n - 1)), 1)
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--member"]:
        s = json.loads(argv[1])
        member(s["port"], s["n"], s["ranks"], s["cores"], s["bytes"], s["reps"], s["master"])
        return 0
    if argv[:1] == ["--burst-proc"]:
        return burst.proc_main(argv)
    if argv[:1] == ["--neighbour"]:
        s = json.loads(argv[1])
        neighbours(s["port"], s["n"], s["cores"], s["bytes"], s["reps"], s["master"])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", default="4,16,32")
    ap.add_argument("--bytes", default="4,12928")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--procs", action="store_true", help="one process a member, each on its own core (the job)")
    ap.add_argument("--neighbours", action="store_true",
                    help="the server plays member 0's two ring neighbours only (session 12's prototype)")
    ap.add_argument("--cores", default="0", help="member 0's core (server layout) or every member's (--procs)")
    ap.add_argument("--server-cores", default="1", help="the server process's cores (server layout)")
    ap.add_argument("--repeats", type=int, default=1, help="each row this many times, interleaved")
    ap.add_argument("--out", help="append the rows as JSON lines")
    ap.add_argument("--burst", nargs="?", const=20, type=int, default=None,
                    help="the runtime's neighbours ring against gloo's all-reduce, bursts of this many async ops "
                         "(default 20); --members and --bytes take one value each")
    ap.add_argument("--bursts", type=int, default=25, help="--burst: bursts a row")
    ap.add_argument("--live", default="0,1", help="--burst: the slice ranks' ring positions")
    ap.add_argument("--gloo-cores", help="--burst: gloo's members' cores, member i on the i-th (cycled; default "
                                         "--cores)")
    ap.add_argument("--layouts", default="gloo,ring",
                    help="--burst: the layouts of a round, in order: gloo (N processes), ring (the runtime's "
                         "neighbours ring), ring16 (the ring with session 16's steps, float32 only)")
    ap.add_argument("--main", default="wait", choices=["wait", "torch", "python"],
                    help="--burst: what a rank's main thread does while its burst runs (`_drain`)")
    ap.add_argument("--server-queue", action="store_true",
                    help="--burst: the server hands a burst's ops to its pool at once (an experiment, not the runtime)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "int32", "int64"])
    ap.add_argument("--table", action="store_true", help="--burst: print the ring against gloo at the end")
    ap.add_argument("--table-from", nargs="+", metavar="ROWS.jsonl",
                    help="print the --burst table of rows saved by --out (one table a file) and exit")
    args = ap.parse_args(argv)
    if args.table_from:
        for path in args.table_from:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            print(f"{path}:\n{burst_table(rows)}\n")
        return 0
    cores, server_cores = _cores(args.cores), _cores(args.server_cores)
    if args.burst is not None:
        n, nbytes, live = int(args.members.split(",")[0]), int(args.bytes.split(",")[0]), _cores(args.live)
        if "ring16" in args.layouts and args.dtype != "float32":
            ap.error("ring16 plays zeros: --dtype float32 only")
        rows = []
        for i in range(args.repeats):
            for layout in args.layouts.split(","):
                row = dict(burst_one(layout, n, live, nbytes, args.burst, args.bursts, cores, server_cores,
                                     args.dtype, _cores(args.gloo_cores) if args.gloo_cores else None,
                                     args.server_queue, args.main), repeat=i, load1=round(os.getloadavg()[0], 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
        if args.table:
            print(burst_table(rows))
        return 0 if all("error" not in r for r in rows) else 1
    for i in range(args.repeats):
        for n in map(int, args.members.split(",")):
            for b in map(int, args.bytes.split(",")):
                row = dict(one(n, b, args.reps, args.procs, cores, server_cores, args.neighbours), repeat=i,
                           load1=round(os.getloadavg()[0], 2))
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
