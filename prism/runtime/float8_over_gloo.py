"""gloo moves no float8 ("Invalid scalar type", raised at the wait from its worker thread): where prism's computing
modes hand a collective to gloo itself (a slice's ranks among themselves and with the replay server), a float8
tensor of an op that only moves data (all-gathers, all-to-alls, broadcast, gather, scatter, send/recv) goes as its
bytes, viewed as uint8: a one-byte float's view keeps its shape, so shapes and splits stay the same, and the
output's bytes are the float8 values. That is what async TP's fp8 all-gather needs (the fallback of
`symm_mem::fused_all_gather_scaled_matmul` gathers the float8 shard) and FSDP2's float8 all-gather. A reduction of
float8 is refused before this (`unsupported.check_op`: prism's fold has no float8 add). Real mode is gloo's, as
under torchrun: untouched.
"""

from __future__ import annotations

import torch


def one_byte_float(dtype: torch.dtype) -> bool:
    """float8 (e4m3fn, e5m2, the fnuz ones, e8m0fnu) and the other one-byte float types: gloo has none."""
    return dtype.is_floating_point and dtype.itemsize == 1


def any_one_byte_float(tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and one_byte_float(t.dtype) for t in tensors)


def as_bytes(value):
    """`value` (a tensor, or lists/tuples of them and of anything else) with every one-byte float tensor viewed as
    uint8 (the same memory: what gloo writes into the view is written into the tensor)."""
    if isinstance(value, torch.Tensor):
        return value.view(torch.uint8) if one_byte_float(value.dtype) else value
    if isinstance(value, (list, tuple)):
        return type(value)(as_bytes(v) for v in value)
    return value
