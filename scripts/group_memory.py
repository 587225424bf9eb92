"""What a capture rank's process groups cost it, by owner (issue 25 item 2, docs/benchmarks.md "Session 16").

A parent prepared as the capture zygote prepares itself before it forks (torch imported, the interception
installed, `immortal.immortalise()` where the interpreter has immortal objects, `malloc_trim`, the C heap's
holes taken, `gc.freeze()`) forks one child per measurement; the child becomes rank R of W on a fake store and
reports its private memory (`memory.private_bytes`, after `gc.collect()` and `malloc_trim` as a rank does when
it waits) before and after, and what `tracemalloc` (started after the "before") says is still alive, by owner:
the innermost frame of its allocation in torch, in prism's runtime, or in the program (prism's reference
workload). Each measurement runs in a fresh parent per variant (`--variants`):

- `prism`: the capture interception with its non-member answer (`nonmember_groups`), as a capture rank runs;
- `torch`: the interception, non-members through torch's own `new_group` (PRISM_FAST_NONMEMBER=0);
- `plain`: no prism at all, torch's `fake` backend;
- `lists`: the program's rank lists only (`build_layout` with a `new_group` that does nothing).

Two measurements:

    # N non-member groups (the lists made and kept before the "before": only what the calls leave)
    .venv/bin/python scripts/group_memory.py nonmember 1000,2 10000,2 1000,64
    # the reference workload's every group (`build_layout`) at a layout tp,pp,dp,ep: the weak layouts
    .venv/bin/python scripts/group_memory.py layout 2,2,256,2 2,2,1024,2 2,2,2048,2 --repeat 3
    # the steps' side: K all-reduces of a group of N members through the capture transport (the member that
    # folds the N contributions, and one that reads the folded value), the contributions' files made first
    .venv/bin/python scripts/group_memory.py allreduce 256 2048 --variants prism

`--json FILE` appends every row (one JSON object a line).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys

VARIANTS = ("prism", "torch", "plain", "lists")
TABLES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg",
          "pg_coalesce_state", "pg_default_device")


def _owner(filename: str) -> str:
    name = filename.replace("\\", "/")
    if "/torch/" in name:
        return "torch"
    if "/prism/workloads/" in name:
        return "program"
    if "/prism/" in name:
        return "prism"
    return "other"


def _prepare(variant: str) -> None:
    """The parent, as the capture zygote makes itself before its forks (`zygote.main`)."""
    if variant == "torch":
        os.environ["PRISM_FAST_NONMEMBER"] = "0"
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 (the `fake` backend, FakeStore)

    from prism.runtime import interception, memory
    from prism.runtime.launch import immortal
    from prism.workloads import parallel  # noqa: F401

    if variant != "plain":
        interception.install("capture", None)
    gc.collect()
    immortal.immortalise()
    memory.trim()
    memory.fill_heap_holes()
    gc.freeze()


def _measure(variant: str, world: int, rank: int, work) -> dict:
    """In the child: rank `rank` of `world`; `work()` between the two measurements; returns the row."""
    import tracemalloc

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from prism.runtime import memory

    dist.init_process_group("fake" if variant == "plain" else "gloo", rank=rank, world_size=world,
                            store=FakeStore())
    prepared = work()  # what must exist before the "before" (returns the call to measure)
    gc.collect()
    memory.trim()
    before = memory.private_bytes()
    tracemalloc.start(1)
    kept = prepared()
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    memory.trim()
    after = memory.private_bytes()
    owners: dict[str, int] = {}
    lines = []
    for stat in snapshot.statistics("lineno"):
        frame = stat.traceback[0]
        owner = _owner(frame.filename)
        owners[owner] = owners.get(owner, 0) + stat.size
        where = frame.filename
        if owner != "other":
            where = where.split("site-packages/")[-1].split("prism/", 1)[-1]
        lines.append((stat.size, stat.count, f"{owner}: {where}:{frame.lineno}"))
    del kept
    world_tables = c10d._world
    return {"variant": variant, "W": world, "rank": rank, "private_grew": after - before,
            "traced_live": sum(owners.values()), "live_by_owner": owners,
            "torch_tables": {t: len(getattr(world_tables, t)) for t in TABLES if hasattr(world_tables, t)},
            "group_count": world_tables.group_count, "python": sys.version.split()[0],
            "top": [f"{size / 1024:.1f} KiB {count} blocks {where}" for size, count, where in sorted(lines)[::-1][:12]]}


def nonmember_work(n: int, size: int):
    """N groups of `size` ranks, rank 0 in none: the lists made first (kept), then only the calls measured."""
    import torch.distributed as dist

    def work():
        lists = [list(range(size * (i + 1), size * (i + 2))) for i in range(n)]

        def call():
            for ranks in lists:
                dist.new_group(ranks)
            return lists

        return call

    return work


def layout_work(variant: str, tp: int, pp: int, dp: int, ep: int):
    def work():
        from prism.workloads import parallel

        def call():
            if variant == "lists":
                saved = parallel.dist.new_group
                parallel.dist.new_group = lambda ranks, group_desc=None: None
                try:
                    return parallel.build_layout(tp, pp, dp, ep)
                finally:
                    parallel.dist.new_group = saved
            return parallel.build_layout(tp, pp, dp, ep)

        return call

    return work


def allreduce_row(n: int, fold: bool, steps: int = 6) -> dict:
    """In the child: `steps` all-reduces of a 1,024-float tensor over N members as member 0 (it folds the N
    contributions: the first to complete) or member 1 (it reads the folded value), on a socket pair for the
    coordinator (what the rank sends is drained and dropped); private memory and tracemalloc's live and peak
    around all but the first (the group's lazy set-up)."""
    import shutil
    import socket
    import tempfile
    import tracemalloc
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from prism.runtime import memory, shm
    from prism.runtime.capture.client import SHARED, CaptureClient, key_name
    from prism.runtime.capture.transport import CaptureTransport

    folder = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, prefix="group-memory-"))
    try:
        data = shm.encode([torch.ones(1024)], {"op": "all_reduce"})
        for seq in range(steps):
            stem = key_name(("c", "7", seq))
            for i in range(n):
                (folder / f"{stem}-r{i}").write_bytes(data)
            if not fold:
                (folder / f"{stem}{SHARED}").write_bytes(shm.encode([torch.full((1024,), float(n))]))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.setblocking(False)
        me = 0 if fold else 1
        client = CaptureClient(me, ours.detach(), folder, None, None, [0])
        transport = CaptureTransport("7", me, list(range(0, 2 * n, 2)), "dp")
        transport._c = client
        t, opts = torch.ones(1024), dist.AllreduceOptions()

        def one(i):
            work = transport.call("allreduce", t.device, [t], opts, work_id=i, op="all_reduce")
            client.pending.clear()
            work.finish()
            try:
                while theirs.recv(1 << 16):
                    pass
            except BlockingIOError:
                pass

        one(0)
        gc.collect()
        memory.trim()
        before = memory.private_bytes()
        tracemalloc.start()
        for i in range(1, steps):
            one(i)
        live, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        gc.collect()
        memory.trim()
        after = memory.private_bytes()
        # (the folding member's own contribution is its tensor, so its value grows each all-reduce)
        assert bool(torch.all(t > 1)) if fold else bool(torch.all(t == n)), "the all-reduce's value"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"variant": "prism", "members": n, "folds": fold, "all_reduces": steps - 1, "private_grew": after - before,
            "traced_live": live, "traced_peak": peak, "python": sys.version.split()[0]}


def in_forked_child(fn) -> dict:
    """`fn()` run in a forked child (this process's pages shared, copy-on-write), its JSON result returned; the
    child's failure stops the script (scripts/layout_memory.py uses it too)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            os.write(w, json.dumps(fn()).encode())
            code = 0
        except BaseException:  # noqa: BLE001 - said, then the child's exit status says it failed
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise SystemExit(f"the measuring child failed ({os.waitstatus_to_exitcode(status)})")
    return json.loads(data)


def parent(variant: str, kind: str, specs: list[str], rank: int) -> list[dict]:
    """In a fresh process: prepare as the zygote does, then one forked child per spec."""
    _prepare(variant)
    rows = []
    for spec in specs:
        numbers = list(map(int, spec.split(",")))
        if kind == "allreduce":
            rows += [in_forked_child(lambda: allreduce_row(numbers[0], fold)) for fold in (True, False)]
            continue
        if kind == "nonmember":
            n, size = numbers
            row = in_forked_child(lambda: _measure(variant, size * (n + 1), 0, nonmember_work(n, size)))
            row.update(groups=n, group_size=size)
        else:
            tp, pp, dp, ep = numbers
            world = tp * pp * dp
            row = in_forked_child(lambda: _measure(variant, world, min(rank, world - 1),
                                                   layout_work(variant, tp, pp, dp, ep)))
            row.update(layout=f"tp{tp}·pp{pp}·dp{dp}·ep{ep}",
                       groups=world // tp + tp * pp + tp * dp + world // ep + tp * pp * ep)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("nonmember", "layout", "allreduce"))
    parser.add_argument("specs", nargs="+", help="nonmember: N,SIZE; layout: TP,PP,DP,EP; allreduce: N")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, of {','.join(VARIANTS)} (default: all; nonmember: all but lists)")
    parser.add_argument("--rank", type=int, default=0, help="the child's rank (layout; capped at W-1)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh parents per variant")
    parser.add_argument("--json", help="append the rows here (one JSON object a line)")
    parser.add_argument("--top", type=int, default=0, help="print each row's largest live allocations, by line")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a variant's own parent process
    args = parser.parse_args()
    if args.child:
        print(json.dumps(parent(args.child, args.kind, args.specs, args.rank)))
        return 0
    default = {"layout": VARIANTS, "nonmember": VARIANTS[:3], "allreduce": ("prism",)}[args.kind]
    variants = args.variants.split(",") if args.variants else list(default)
    rows = []
    for _ in range(args.repeat):
        for variant in variants:
            cmd = [sys.executable, __file__, args.kind, *args.specs, "--child", variant, "--rank", str(args.rank)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows += json.loads(out.strip().splitlines()[-1])
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if args.kind == "allreduce":
        print(f"{'members':>8} {'member':<24} {'all-reduces':>11} {'private KiB':>12} {'live KiB':>9} {'peak KiB':>9}")
        for r in rows:
            who = "0 (folds the N)" if r["folds"] else "1 (reads the folded value)"
            print(f"{r['members']:>8} {who:<24} {r['all_reduces']:>11} {r['private_grew'] / 1024:>12.0f} "
                  f"{r['traced_live'] / 1024:>9.1f} {r['traced_peak'] / 1024:>9.1f}")
        return 0
    print(f"{'variant':<8} {'what':<22} {'groups':>7} {'private KiB':>12} {'live KiB':>9}  live by owner (KiB); "
          f"torch's tables")
    for r in rows:
        what = r.get("layout") or f"{r['groups']} x {r['group_size']} ranks"
        owners = " ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(r["live_by_owner"].items()))
        tables = ",".join(f"{k}={v}" for k, v in r["torch_tables"].items() if k in ("pg_map", "pg_group_ranks",
                                                                                   "pg_names"))
        print(f"{r['variant']:<8} {what:<22} {r['groups']:>7} {r['private_grew'] / 1024:>12.0f} "
              f"{r['traced_live'] / 1024:>9.0f}  {owners}; {tables}")
        for line in r["top"][:args.top]:
            print("    ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
