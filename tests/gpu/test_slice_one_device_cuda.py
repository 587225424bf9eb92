"""Two slice ranks of one all-slice group on one CUDA device (a W=8 FSDP2 4 x TP 2 slice on one H200 is a whole
TP pair): NCCL refuses two ranks on one device, so the group carries its CUDA tensors over gloo
(`SliceTransport.shares_a_device`), and a CUDA all-reduce over it gives the sum. The CPU half of the rule:
tests/unit/test_slice_backend.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from torch._C._distributed_c10d import HashStore

from prism import settings
from prism.runtime.slice.transport import SliceTransport
from tests.gpu.gpu_env import requires_cuda
from tests.unit.test_slice_backend import on_both_members

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_an_all_slice_pair_on_one_gpu_all_reduces_cuda_tensors_over_gloo(monkeypatch):
    monkeypatch.setenv(settings.SLICE_RANKS.name, "0,1")
    store, device = HashStore(), torch.device("cuda", 0)
    made = on_both_members(lambda rank: SliceTransport(store, rank, 2, timedelta(seconds=30), want_nccl=True,
                                                       global_ranks=[0, 1], group_name="tp", results=None))

    def all_reduce(rank: int) -> torch.Tensor:
        backend = made[rank].backend_for(device)
        assert backend is made[rank]._gloo()
        t = torch.full((4,), float(rank + 1), device=device)
        backend.allreduce([t]).wait()
        return t.cpu()

    for got in on_both_members(all_reduce):
        assert torch.equal(got, torch.full((4,), 3.0))
