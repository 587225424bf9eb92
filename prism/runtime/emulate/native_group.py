"""Collectives of an emulated group whose participants are all sandbox ranks: native gloo ops, no protocol.

When every member of a group is a sandbox rank (the EP group of dp8-ep4 with sandbox 0-3), the pruned
protocol (`prism.runtime.emulate.pruned`: blobs with meta, one message per plan link, one thread per group) has no
compensator to talk to: the participants' own `ProcessGroupGloo` moves the same bytes with one native op.
`issue` starts that op on the caller's thread and returns its gloo works and what completes it:
- data movement (all_to_all_single, all_gather[_into_tensor], broadcast, barrier): the gloo op itself;
  every member's output holds the other members' input bytes, as the protocol's `got` does;
- reduce_scatter_tensor keeps prism's left fold (`semantics.reduce`, bitwise what the protocol's chain
  gives): each member receives its chunk of every member's input (`alltoall_base`, equal splits) and folds
  them in group order (`compensation.fold`). Gloo's own reductions (ring order) are not used where order
  matters;
- all_reduce SUM of a group of two members (a TP pair): gloo's own allreduce. Two members have no order:
  each element is x0 + x1, and IEEE addition is commutative, so gloo's result is the left fold's bitwise
  (float32/64, float16, bfloat16, int64 checked). It is the op the slice runs timed (`SliceTransport` runs
  the real backend), where the protocol's chain on the group thread, held to that calibrated transfer,
  ended 0.3 ms an op past the model at the median, 22-31 ms an iteration in the TP configs of session 16
  (session 17 in `docs/fidelity.md`).
The other kinds answer None and `EmulateTransport` runs the protocol for them: all_reduce of more than two
members or another op (gathering every member's tensor to fold it locally measured no faster than the
protocol's chain: `prism bench emulate-ops`), reduce, list reduce_scatter / all_to_all, gather, scatter,
all_gather_coalesced. CUDA tensors go through host copies (gloo here
reads and writes host memory; nothing is allocated on the sandbox's device); CPU contiguous tensors are
read and written in place. `sent` is the tensor bytes this member sends (the protocol's accounting).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, AllToAllOptions, ProcessGroupGloo, ReduceOp, Work

from prism.runtime.emulate import compensation as comp
from prism.runtime import float8_over_gloo, semantics


def all_sandbox(parts: list[tuple[int, list[int]]], sandbox: set[int]) -> bool:
    """Whether a group's participants (`pruned.participants`) are all sandbox members, more than one."""
    return len(parts) > 1 and all(comp.is_sandbox(p, sandbox) for p in parts)


def _host(t: torch.Tensor) -> torch.Tensor:
    """What gloo reads: the tensor itself when it is host memory, contiguous; else a host copy."""
    return t if not t.is_cuda and t.is_contiguous() else t.detach().contiguous().cpu()


def _out(t: torch.Tensor) -> torch.Tensor:
    """Where gloo writes: the output itself when it is host memory, contiguous; else a host buffer."""
    return t if not t.is_cuda and t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype)


def _back(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy host buffers into the outputs they stand for."""
    for out, buf in pairs:
        if buf is not out:
            semantics.write(out, buf)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


Issued = tuple[list[Work], Callable[[], None], int]  # gloo works, completion, bytes sent


def issue(pg: ProcessGroupGloo, n: int, me: int, method: str, args: tuple) -> Issued | None:
    """Start transport method `method` (`PrismProcessGroup`'s names) of member `me` of `n` natively (None: the
    protocol runs it; so float8 data, which gloo does not move)."""
    handler = _METHODS.get(method)
    if handler is None or float8_over_gloo.any_one_byte_float(_tensors(args)):
        return None
    return handler(pg, n, me, *args)


def _tensors(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out


def _alltoall_base(pg, n, me, output, input, output_split_sizes, input_split_sizes, opts) -> Issued:
    ins, outs = list(input_split_sizes), list(output_split_sizes)
    src, buf = _host(input), _out(output)
    work = pg.alltoall_base(buf, src, outs, ins, AllToAllOptions())
    row = _nbytes(src) // max(src.shape[0], 1) if src.dim() else 0
    mine = (ins[me] if ins else (src.shape[0] // n if src.dim() else 0)) * row
    return [work], lambda: _back([(output, buf)]), _nbytes(src) - mine


def _all_gather_single(pg, n, me, output, input, opts) -> Issued:
    src, buf = _host(input), _out(output)
    work = pg._allgather_base(buf, src, AllgatherOptions())
    return [work], lambda: _back([(output, buf)]), (n - 1) * _nbytes(src)


def _allgather(pg, n, me, output_tensors, input_tensors, opts) -> Issued:
    srcs = [_host(t) for t in input_tensors]
    bufs = [[_out(o) for o in outs] for outs in output_tensors]
    work = pg.allgather(bufs, srcs, AllgatherOptions())
    pairs = [(o, b) for outs, bs in zip(output_tensors, bufs) for o, b in zip(outs, bs)]
    return [work], lambda: _back(pairs), (n - 1) * sum(map(_nbytes, srcs))


def _broadcast(pg, n, me, tensors, opts) -> Issued:
    root = opts.rootRank
    bufs = [_host(t) if me == root else _out(t) for t in tensors]
    work = pg.broadcast(bufs, opts)
    finish = (lambda: None) if me == root else (lambda: _back(list(zip(tensors, bufs))))
    return [work], finish, (n - 1) * sum(map(_nbytes, bufs)) if me == root else 0


def _barrier(pg, n, me, opts) -> Issued:
    return [pg.barrier()], lambda: None, 0


def _reduce_scatter_single(pg, n, me, output, input, opts) -> Issued:
    red = semantics.red_op(opts)
    src = _host(input).reshape(-1)
    if src.numel() % n:
        return None  # not n equal chunks: the protocol names the error
    buf = torch.empty((n, src.numel() // n), dtype=src.dtype)
    works = [pg.alltoall_base(buf.view(-1), src, [], [], AllToAllOptions())] if src.numel() else []

    def finish() -> None:
        semantics.write(output, comp.fold(red, list(buf.unbind(0))).view_as(output))

    return works, finish, _nbytes(src) - _nbytes(src) // n


def _allreduce(pg, n, me, tensors, opts) -> Issued | None:
    if n != 2 or semantics.red_op(opts) != semantics.RedOp.SUM or not tensors \
            or any(t.is_sparse or t.is_complex() or t.dtype == torch.bool for t in tensors):
        return None  # the protocol's chain: the left fold in group order
    bufs = [_host(t) for t in tensors]  # (CPU contiguous: reduced in place, as gloo's allreduce does)
    options = AllreduceOptions()
    options.reduceOp = ReduceOp.SUM
    work = pg.allreduce(bufs, options)
    return [work], lambda: _back(list(zip(tensors, bufs))), sum(map(_nbytes, bufs))


_METHODS = {"allreduce": _allreduce, "alltoall_base": _alltoall_base, "all_gather_single": _all_gather_single, "allgather": _allgather,
            "broadcast": _broadcast, "barrier": _barrier, "reduce_scatter_single": _reduce_scatter_single}
