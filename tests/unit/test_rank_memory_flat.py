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
