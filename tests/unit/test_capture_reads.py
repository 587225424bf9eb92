"""How many contribution files a capture rank reads and looks at to complete a collective (issue 25 item 3): an
all-reduce of N members is folded once, by the first member that completes it, and shared (`CaptureTransport
._reduced`), so a collective costs ~2N reads, not N² (the weak layout's DP all-reduce of 2,048 members at W=8192:
~4 M reads a collective before); a waiting member finds a missing contribution at its first look. Driven here
without a coordinator: N transports of one group on one client each, over a real shared-memory folder."""

import socket

import pytest
import torch
import torch.distributed as dist

from prism.runtime import semantics, shm
from prism.runtime.capture import client as capture_client
from prism.runtime.capture.client import SHARED, CaptureClient, key_name
from prism.runtime.capture.transport import CaptureTransport


class _Opts:
    def __init__(self, op):
        self.reduceOp = op


@pytest.fixture
def members(tmp_path):
    """N ranks of one group, each a transport on its own client (its socket's far end just kept open)."""
    made = []

    def make(n):
        for rank in range(n):
            ours, theirs = socket.socketpair()
            made.append(theirs)
            c = CaptureClient(rank, ours.detach(), tmp_path, None, None, [0])
            t = CaptureTransport("g", rank, list(range(n)), "dp")
            t._c = c  # linked: no "group" message
            yield t

    yield make
    for s in made:
        s.close()


def _counting(monkeypatch):
    """The files `shm.read` read (a look for a file not there is not a read)."""
    reads = []
    original = shm.read

    def read(path):
        got = original(path)
        reads.append(str(path))
        return got

    monkeypatch.setattr(shm, "read", read)
    return reads


@pytest.mark.parametrize("op", [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX])
def test_an_all_reduce_is_folded_once_and_every_member_gets_the_same_bits(members, monkeypatch, op):
    n = 9
    ranks = list(members(n))
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(5, 3, generator=gen, dtype=torch.float32) for _ in ranks]
    expected = semantics.reduce([x.clone() for x in inputs], semantics.red_op(_Opts(op)))
    tensors = [x.clone() for x in inputs]
    works = [t.call("allreduce", None, [x], _Opts(op), work_id=1) for t, x in zip(ranks, tensors)]
    reads = _counting(monkeypatch)
    for w in works:
        assert w.ready()
        w.finish()
    assert len(reads) == n + (n - 1)  # the first member folds the n contributions, the others read the value
    assert sum(r.endswith(SHARED) for r in reads) == n - 1
    for t in tensors:
        assert torch.equal(t, expected)  # to the bit, as when each member folded the n files itself


def test_a_waiting_member_finds_the_missing_contribution_at_its_first_look(members, monkeypatch):
    n = 64
    ranks = list(members(n))
    looked = []
    exists = capture_client.os.path.exists
    monkeypatch.setattr(capture_client.os.path, "exists", lambda p: looked.append(p) or exists(p))
    works = []
    for t in ranks[:-1]:  # every member but the last has arrived, in rank order (as the slots run them)
        works.append(t.call("allreduce", None, [torch.ones(4)], _Opts(dist.ReduceOp.SUM), work_id=1))
        looked.clear()
        assert not works[-1].ready()
        assert len(looked) == 2  # the shared value, then the last member's contribution: not every member's
    works.append(ranks[-1].call("allreduce", None, [torch.ones(4)], _Opts(dist.ReduceOp.SUM), work_id=1))
    looked.clear()
    assert works[-1].ready()
    assert len(looked) == n + 1  # complete: each contribution looked at once
    works[0].finish()
    looked.clear()
    assert works[1].ready() and len(looked) == 1  # the value is shared: one look


def test_the_shared_value_file_goes_with_the_collectives_files(tmp_path):
    from prism.runtime.capture.coordinator_link import CoordinatorLink

    link = CoordinatorLink.__new__(CoordinatorLink)  # only what `_apply` uses of it
    link._key_name, link._shared, link._shm = key_name, SHARED, str(tmp_path)

    class Coord:
        file_moves, device_actions, finished_keys = [], [], [("c", "g", 0)]
        groups, crashed = {"g": ("dp", (0, 1, 2))}, True

    class Doomed(list):
        put = list.append

    link.coord, link._doomed, link.error = Coord(), Doomed(), None
    link._apply([])
    stem = f"{tmp_path}/c-g-0"
    assert link._doomed == [[f"{stem}-r0", f"{stem}-r1", f"{stem}-r2", stem + SHARED]]


def test_a_coalesced_all_reduce_shares_every_tensor_with_its_dtype_and_shape(members):
    ranks = list(members(4))
    inputs = [[torch.full((2, 3), float(r) + 0.25), torch.arange(5, dtype=torch.int64) * r] for r in range(4)]
    outs = [[t.clone() for t in ins] for ins in inputs]
    works = [t.call("allreduce_coalesced", None, out, _Opts(dist.ReduceOp.SUM), work_id=1)
             for t, out in zip(ranks, outs)]
    for w in works:
        w.finish()
    for out in outs:
        assert out[0].dtype == torch.float32 and out[0].shape == (2, 3) and torch.equal(out[0], torch.full((2, 3), 7.0))
        assert out[1].dtype == torch.int64 and torch.equal(out[1], torch.arange(5, dtype=torch.int64) * 6)
