"""The works prism's backend returns when the real backend returns none, as NCCL does: an op not asked for
asynchronously (synchronised at the C++ level) and ops inside a coalesced batch (they complete with the
batch's work). A fake transport stands in for NCCL (CI has no GPU; tests/gpu runs the real one)."""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import _create_work_from_future

from prism.runtime.backend import PrismProcessGroup


def completed(value) -> object:
    fut = torch.futures.Future()
    fut.set_result(value)
    return _create_work_from_future(fut)


class NcclLike:
    """Returns no work for ops (synchronous, or inside a batch) and one work for a batch."""

    def __init__(self) -> None:
        self.batch = None

    def call(self, method, device, *args, work_id=-1, op=""):
        return None

    def start_coalescing(self, device) -> None:
        pass

    def end_coalescing(self, device):
        self.batch = completed([])
        return self.batch


def group() -> tuple[PrismProcessGroup, NcclLike]:
    transport = NcclLike()
    return PrismProcessGroup(0, 1, [0], "0", None, transport, None), transport


def test_a_synchronised_op_gets_a_completed_work_with_its_outputs() -> None:
    pg, _ = group()
    t = torch.ones(3)
    work = pg.allreduce([t])
    assert work.is_completed() and work.wait()
    assert work.result()[0] is t
    assert work.get_future().value()[0] is t
    assert pg.barrier().wait() and pg.barrier().result() == []


def test_ops_of_a_batch_complete_with_the_batch_work() -> None:
    pg, transport = group()
    pg._start_coalescing(torch.device("cpu"))
    send, recv = pg.send([torch.ones(2)], 0, 0), pg.recv([torch.zeros(2)], 0, 0)
    assert not send.is_completed(), "before the batch ends, its ops have not run"
    joined = pg._end_coalescing(torch.device("cpu"))
    assert send._inner == [transport.batch] and recv._inner == [transport.batch]
    assert joined._inner == [transport.batch, transport.batch]
    assert joined.wait() and joined.is_completed()
    assert joined.get_future().wait() == [], "the batch's one work counts once"
