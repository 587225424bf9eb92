"""A capture rank's Python memory that would grow with W (issue 25 item 2), measured by `tracemalloc` (what the
objects hold, deterministic; not a timing): the reference workload's group building holds one kind of group's
rank lists at a time, and a collective in flight holds no object per member of its group."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tracemalloc

import torch
import torch.distributed as dist

from prism.runtime.capture.client import CaptureClient, CaptureWork
from prism.runtime.capture.transport import CaptureTransport
from tests.conftest import REPO, make_env

# every group of tp2·pp2·dp512·ep2 (W=2048, 3,084 groups) built by rank 0 on a fake store, prism's capture
# interception installed; prints tracemalloc's peak of what build_layout allocated
_BUILD = """
import json, tracemalloc
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from prism.runtime import interception
from prism.workloads.parallel import build_layout
interception.install("capture", None)
dist.init_process_group("gloo", rank=0, world_size=2048, store=FakeStore())
tracemalloc.start()
lay = build_layout(2, 2, 512, 2)
live, peak = tracemalloc.get_traced_memory()
print(json.dumps({"live": live, "peak": peak, "dp": dist.get_world_size(lay.dp_group)}))
"""


def test_building_every_group_holds_one_kind_at_a_time():
    proc = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=make_env(PRISM_FAST_NONMEMBER="1"))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.splitlines()[-1])
    assert row["dp"] == 512
    # all five kinds' lists at once: 0.88 MiB at their peak (what the interpreter then keeps resident in a
    # forked rank: +4.3 MiB private at W=8192, scripts/layout_memory.py); one kind at a time, the largest (tp,
    # pp or ep: 1,024 lists of 2 ranks) 0.27 MiB
    assert row["peak"] < 512 * 1024, row


def test_a_collective_in_flight_holds_no_object_per_member(tmp_path):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    c = CaptureClient(0, ours.detach(), tmp_path, None, None, [0])
    members = list(range(0, 4096, 2))  # a dp group of 2,048 ranks, this rank its first member
    transport = CaptureTransport("7", 0, members, "dp")
    transport._c = c
    t = torch.ones(2)
    opts = dist.AllreduceOptions()
    transport.call("allreduce", t.device, [t], opts, work_id=0, op="all_reduce")  # the first: lazy set-up
    c.pending.clear()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    work = transport.call("allreduce", t.device, [t], opts, work_id=1, op="all_reduce")
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert isinstance(work, CaptureWork) and c.pending == [work]
    # a path per member was ~0.5 MiB for 2,048 members; now the key and the members' range
    assert held < 24 * 1024, held
    assert len(work.needs) == 2048
    assert list(work.needs) == [c.path(("c", "7", 1), f"-r{i}") for i in range(2048)]
    assert not work.ready()
    for p in list(work.needs):
        p.touch()
    assert work.ready()
    theirs.close()


# a process with 2,000 free 48-byte chunks in its C heap (between 4 KiB chunks in use), as a zygote has free
# chunks all over its heap after its imports; then 2,000 small allocations, as a forked rank makes: how many land
# in those free chunks (in a rank, each one copies the zygote's page it lands on), with or without
# `fill_heap_holes` before them
_HOLES = """
import ctypes, json, sys
from prism.runtime import memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
small = []
for _ in range(2000):
    small.append(libc.malloc(40))
    libc.malloc(4000)
holes = set(small)
for p in small:
    libc.free(p)
memory.trim()
filled = memory.fill_heap_holes() if sys.argv[1] == "fill" else None
landed = sum(libc.malloc(40) in holes for _ in range(2000))
print(json.dumps({"landed": landed, "filled": filled}))
"""


def _holes(how: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _HOLES, how], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=make_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_forked_rank_allocates_on_fresh_pages_once_the_zygote_took_its_free_chunks():
    plain, filled = _holes("plain"), _holes("fill")
    assert plain["landed"] > 1500, plain  # malloc reuses free chunks first
    assert filled["filled"]["chunks"] >= 2000 and filled["filled"]["free_left"] == 0, filled
    assert filled["landed"] == 0, filled  # every allocation from the heap's top: fresh pages in a rank


# N non-member `new_group` calls in a capture rank (rank 0 of 2N+2 on a fake store, the interception installed),
# the rank lists made first and kept: what the calls leave alive (tracemalloc) and torch's per-group tables
_NONMEMBER = """
import gc, json, sys, tracemalloc
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore
from prism.runtime import interception
interception.install("capture", None)
rows = []
for n in (50, 200, 2000):  # (the first: one-off costs of a first call)
    dist.init_process_group("gloo", rank=0, world_size=2 * n + 2, store=FakeStore())
    lists = [[2 * i + 2, 2 * i + 3] for i in range(n)]
    gc.collect()
    tracemalloc.start()
    same = sum(dist.new_group(ranks) is dist.GroupMember.NON_GROUP_MEMBER for ranks in lists) == n
    gc.collect()
    live = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    w = c10d._world
    rows.append({"n": n, "live": live, "tables": [len(w.pg_map), len(w.pg_names), len(w.pg_group_ranks)],
                 "same": same})
    dist.destroy_process_group()
print(json.dumps(rows[1:]))
"""


def test_a_non_member_group_leaves_nothing_per_group():
    """Every rank makes every group of the job (1.5W + 12 at the weak layouts): what a non-member call leaves must
    not grow with their number (docs/benchmarks.md "Session 16": 0 bytes a group, by this measure)."""
    proc = subprocess.run([sys.executable, "-c", _NONMEMBER], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=make_env(PRISM_FAST_NONMEMBER="1"))
    assert proc.returncode == 0, proc.stderr
    few, many = json.loads(proc.stdout.splitlines()[-1])
    assert few["same"] and many["same"]
    assert few["tables"] == many["tables"] == [1, 1, 2], (few, many)  # the default group, + NON_GROUP_MEMBER's map
    # 1,800 more groups: under 2 bytes each (kept per group by anything: a dict entry is ~100 B, a handle 8 B)
    assert many["live"] - few["live"] < 1800 * 2, (few, many)


# a member group of 2,048 ranks (W=4096, rank 0 its first member), made in a capture rank: the prism group's
# members are the program's own int objects, and what prism's modules allocated for the group (tracemalloc)
_MEMBER = """
import gc, json, tracemalloc
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from prism.runtime import interception
from prism.runtime.backend import PrismProcessGroup
interception.install("capture", None)
dist.init_process_group("gloo", rank=0, world_size=4096, store=FakeStore())
ranks = list(range(0, 4096, 2))
gc.collect()
tracemalloc.start(1)
group = dist.new_group(ranks)
gc.collect()
snap = tracemalloc.take_snapshot()
tracemalloc.stop()
prism = sum(s.size for s in snap.statistics("filename") if "/prism/" in s.traceback[0].filename)
pg = next(o for o in gc.get_objects() if isinstance(o, PrismProcessGroup) and len(o._global_ranks) == 2048)
print(json.dumps({"prism": prism, "shared": all(a is b for a, b in zip(pg._global_ranks, ranks)),
                  "members": list(pg._global_ranks) == ranks, "size": dist.get_world_size(group)}))
"""


def test_a_member_group_keeps_the_programs_rank_objects():
    """The rank's own groups are kept for its life; at the weak layouts their size grows with W (dp W/4, edp W/8).
    prism's group holds the ranks the program passed (their int objects), not a new int per member from torch's
    C++ vector (~32 B a member: 96 KiB a rank at W=8192 weak)."""
    proc = subprocess.run([sys.executable, "-c", _MEMBER], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=make_env(PRISM_FAST_NONMEMBER="1"))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.splitlines()[-1])
    assert row["size"] == 2048 and row["members"], row
    assert row["shared"], row
    # the members list and the transport's tuple (8 B a member each) and the group's own objects; with a new
    # int per member it was ~81 KiB (48 B a member)
    assert row["prism"] < 2048 * 24, row


def test_a_collective_makes_no_interned_name_per_member(tmp_path, monkeypatch):
    """The member that folds an all-reduce reads every member's file: named through `pathlib`, each name was
    interned (`sys.intern`), one per member of every collective the rank folds, forever on CPython 3.12.0-3.12.4
    (immortal interned strings) and, on any version, growing the interpreter's table of interned strings, which
    a forked rank then copies whole (3.7 MiB in a rank that folded five all-reduces of 8,192 members,
    `scripts/group_memory.py allreduce`). The files are named as strings now: no name is interned, whatever N."""
    from prism.runtime import shm

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    c = CaptureClient(0, ours.detach(), tmp_path, tmp_path / "payloads", None, [0])
    members = list(range(0, 4096, 2))
    transport = CaptureTransport("7", 0, members, "dp")
    transport._c = c
    data = shm.encode([torch.ones(4)], {"op": "all_reduce"})
    for seq in range(2):
        for i in range(1, 2048):
            (tmp_path / f"c-7-{seq}-r{i}").write_bytes(data)
    t = torch.ones(4)
    opts = dist.AllreduceOptions()
    first = transport.call("allreduce", t.device, [t], opts, work_id=0, op="all_reduce")  # the lazy set-up
    c.pending.clear()
    first.finish()
    interned = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda s: interned.append(s) or real(s))
    work = transport.call("allreduce", t.device, [t], opts, work_id=1, op="all_reduce")
    assert work.ready()
    c.pending.clear()
    work.finish()  # this rank folds the 2,048 contributions (no value shared yet), writes the shared one
    monkeypatch.undo()
    assert torch.all(t == 2048 + 2047), t  # its own (2,048 after the first) + 2,047 ones
    assert (tmp_path / "c-7-1-sum").exists() and len(c.payload_rows) == 4  # its contributions and results kept
    assert interned == [], interned[:5]
    theirs.close()
