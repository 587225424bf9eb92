"""prism/runtime/float8_over_gloo.py: float8 data handed to gloo as uint8 views of the same memory (gloo moves no
float8), everything else as it was; the multi-process runs: tests/integration/test_async_tp.py (a slice's float8
all-gathers among its ranks and with the replay server)."""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import AllgatherOptions

from prism.runtime import float8_over_gloo as f8


def test_one_byte_floats_are_the_float8_types():
    assert all(f8.one_byte_float(d) for d in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                              torch.float8_e5m2fnuz))
    assert not any(f8.one_byte_float(d) for d in (torch.uint8, torch.int8, torch.bfloat16, torch.float32, torch.bool))


def test_views_share_memory_keep_shapes_and_leave_the_rest_alone():
    out = torch.zeros(2, 3, dtype=torch.float8_e4m3fn)
    src = torch.randn(3).to(torch.float8_e4m3fn)
    other, opts = torch.ones(2), AllgatherOptions()
    args = ([[out], [other]], (src,), opts, 7)
    mapped = f8.as_bytes(args)
    (outs, others), (src8,), same_opts, seven = mapped
    assert outs[0].dtype == torch.uint8 and outs[0].shape == out.shape and src8.shape == src.shape
    assert others[0] is other and same_opts is opts and seven == 7 and isinstance(mapped[1], tuple)
    outs[0][1].copy_(src8)  # what gloo writes into the view is the float8 tensor's value
    assert torch.equal(out[1].float(), src.float())
    assert f8.any_one_byte_float([other, src]) and not f8.any_one_byte_float([other, 3])
