"""What a collective computes, defined once for every mode that computes collectives itself.

Reduction order: a reduction folds the members' tensors left to right in group order (the group's ring
order), elementwise, with no chunking: ``((x0 op x1) op x2) ...``. The result therefore depends neither on
message sizes nor on which member computes it, so every member computes it itself and gets the same bits,
and a later mode that replays some members can reproduce it from the prefix fold (DESIGN §3, pruning).
AVG is SUM followed by a division by the group size. The results equal gloo's within float rounding
(gloo's own order differs); for two members they are bitwise equal (addition commutes).

All functions are pure: lists of the members' tensors in, this member's outputs out.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

RedOp = dist.ReduceOp.RedOpType

_FOLD = {
    RedOp.SUM: torch.add,
    RedOp.AVG: torch.add,
    RedOp.PRODUCT: torch.mul,
    RedOp.MIN: torch.minimum,
    RedOp.MAX: torch.maximum,
    RedOp.BAND: torch.bitwise_and,
    RedOp.BOR: torch.bitwise_or,
    RedOp.BXOR: torch.bitwise_xor,
}
REDUCTIONS = tuple(_FOLD)  # the reduce ops prism defines (others are refused at issue: runtime.unsupported)


class UnsupportedOp(Exception):
    """A reduction or op prism does not define (the message names it)."""


def red_op(opts) -> RedOp:
    op = opts.reduceOp
    return op.op if hasattr(op, "op") else op


def fold_into(dst: torch.Tensor, src: torch.Tensor, op: RedOp) -> None:
    """dst <- dst (op) src in place: one step of the fold (AVG's division is the caller's)."""
    fn = _FOLD.get(op) or Fold(op).fn  # (Fold raises UnsupportedOp naming the supported ops)
    fn(dst, src, out=dst)


def reduce(tensors: Sequence[torch.Tensor], op: RedOp) -> torch.Tensor:
    """Left fold of `tensors` (group order) under `op`."""
    fold = Fold(op)
    for t in tensors:
        fold.add(t)
    return fold.result()


class Fold:
    """`reduce` fed one member's tensor at a time (group order): only the running value and the current
    member's tensor are alive at once, so a rank's memory does not grow with the group size."""

    def __init__(self, op: RedOp) -> None:
        if op not in _FOLD:
            raise UnsupportedOp(f"reduce op {op} is not supported by prism (supported: "
                                f"{', '.join(str(o).split('.')[-1] for o in _FOLD)})")
        self.op, self.fn, self.acc, self.n = op, _FOLD[op], None, 0

    def add(self, t: torch.Tensor) -> None:
        if self.acc is not None and t.shape != self.acc.shape:  # as gloo and NCCL: elementwise over the counts
            t = t.reshape(self.acc.shape)
        self.acc = t.clone() if self.acc is None else self.fn(self.acc, t)
        self.n += 1

    def result(self) -> torch.Tensor:
        acc, n = self.acc, self.n
        if self.op == RedOp.AVG:
            acc = acc / n if acc.is_floating_point() else acc // n
        return acc


def all_gather(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(tensors)


def reduce_scatter_chunk(inputs: Sequence[torch.Tensor], op: RedOp, member: int, n: int) -> torch.Tensor:
    """This member's chunk of the reduction of flat inputs split into `n` equal chunks along dim 0."""
    chunks = [t.reshape(n, -1)[member] for t in inputs]
    return reduce(chunks, op)


def all_to_all_single(inputs: Sequence[torch.Tensor], in_splits: Sequence[Sequence[int]],
                      member: int) -> torch.Tensor:
    """This member's output: the slice of every member's input addressed to it, in group order.

    `in_splits[i]` are member i's input split sizes along dim 0 (empty: equal splits).
    """
    n = len(inputs)
    pieces = []
    for i, t in enumerate(inputs):
        splits = list(in_splits[i]) or [t.shape[0] // n] * n
        start = sum(splits[:member])
        pieces.append(t.narrow(0, start, splits[member]))
    return torch.cat(pieces, dim=0)


def write(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Write a collective's result into the program's tensor `dst` as a backend does: through its memory,
    unseen by autograd (no grad recorded, the version counter unchanged). gloo's in-place algorithms
    (all_reduce, broadcast, reduce, functional collectives) leave it as it was; a Python `copy_` bumps it,
    and where that happens after the op returned (a result delivered at wait), selective activation
    checkpointing, which cached the output with its version, fails at recomputation ("Tensor cached during
    selective activation checkpoint has been mutated"). (gloo's c10d all_gather_into_tensor and
    reduce_scatter_tensor do bump it, on gloo's thread, before or after the call returns: a race no
    program can rely on; prism's never do.)"""
    if src.shape != dst.shape and src.numel() == dst.numel():  # a member's own shape for the same count
        src = src.reshape(dst.shape)
    with torch.no_grad(), torch.autograd.grad_mode._unsafe_preserve_version_counter(dst):
        dst.copy_(src)
