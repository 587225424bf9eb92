"""Exact pruned collectives: folding live and recorded contributions to the bits `semantics` defines.

A pruned collective of a group with n members runs among the sandbox members and one compensating virtual
peer per maximal run of consecutive virtual members (`pruned_members`). The result a sandbox member gets
must be bitwise `semantics.reduce(all n contributions, op)`: the left fold ``((x0 op x1) op x2) ...`` in
group order, with the sandbox's live contributions in their places.

What a compensator may fold ahead (a left fold does not re-associate):
- The run *before the first sandbox member* (members 0..f-1): its left fold does not depend on any live
  value, so its compensator supplies it as one tensor, `prefold(op, run)`.
- A run *after* a sandbox member: the accumulator at its start holds a live value, and for a float
  SUM/AVG/PRODUCT ``(acc + a) + b`` is not ``acc + (a + b)``. Such a run cannot be pre-folded into one
  tensor. Either its members' contributions travel individually to whoever folds (k tensors for k
  members), or — the exact chain the runtime should use — the running accumulator travels to the run's
  compensator, which continues the fold with `fold_from(op, acc, run)` and passes one tensor on.
  Chain order = group order: [leading prefold] -> sandbox a -> run compensator -> sandbox b -> ... ->
  `finish` at the last participant, whose result goes back to every sandbox member. Each link carries one
  tensor, so the bytes are O(s) tensors, flat in n (`prism.bench.pruning` counts them).
- Where the op is exactly associative for the dtype (MIN, MAX, BAND, BOR, BXOR; SUM/AVG/PRODUCT on
  integers, which wrap modulo 2^64) any run may be pre-folded (`can_prefold`).
AVG folds as SUM; the division by n (the whole group's size) happens once at the very end (`finish`).

Half types: torch rounds to the dtype after every step (bf16 + bf16 -> bf16), and so do both paths here.
CPU tensors fold with the same torch ops `semantics` uses (so the bits are those of `semantics` by
construction); CUDA tensors fold in one kernel of `cuda/fold.cu` (built on first use, never on import)
that repeats the CPU rounding step by step. A fold of host and CUDA contributions (a host accumulator
continued with a sandbox's live CUDA tensors) runs in the kernel too, reading the host ones from pinned
memory, and gives a pinned host tensor: nothing is allocated on the device.
"""

from __future__ import annotations

from typing import Sequence

import torch

from prism.runtime import semantics
from prism.runtime.semantics import RedOp, UnsupportedOp

_FOLD = semantics._FOLD  # the one definition of each reduction's elementwise step
_ALWAYS_ASSOCIATIVE = {RedOp.MIN, RedOp.MAX, RedOp.BAND, RedOp.BOR, RedOp.BXOR}


def _check(op: RedOp, tensors: Sequence[torch.Tensor]) -> None:
    if op not in _FOLD:
        raise UnsupportedOp(f"reduce op {op} is not supported by prism (supported: "
                            f"{', '.join(str(o).split('.')[-1] for o in _FOLD)})")
    if not tensors:
        raise ValueError("nothing to fold: a fold needs at least one contribution")
    first = tensors[0]
    # one device, or host tensors beside CUDA tensors of one device (the kernel reads both: `fold_from`)
    places = {t.device for t in tensors}
    mixed = len(places) > 1 and not (len(places) == 2 and {d.type for d in places} == {"cpu", "cuda"})
    for t in tensors[1:]:
        if t.dtype != first.dtype or t.shape != first.shape or mixed:
            raise ValueError(f"contributions differ: {first.dtype}{tuple(first.shape)} on {first.device} vs "
                             f"{t.dtype}{tuple(t.shape)} on {t.device}; every member contributes the same "
                             f"dtype and shape")


def can_prefold(op: RedOp, dtype: torch.dtype, leading: bool) -> bool:
    """Whether a run of recorded contributions may be supplied as one pre-folded tensor.

    `leading`: the run precedes the first sandbox member. Otherwise only exactly associative ops qualify.
    """
    if leading:
        return True
    if op in _ALWAYS_ASSOCIATIVE:
        return True
    return op in (RedOp.SUM, RedOp.AVG, RedOp.PRODUCT) and not (dtype.is_floating_point or dtype.is_complex)


def _uses_kernel(t: torch.Tensor) -> bool:
    return t.is_cuda


def fold_from(op: RedOp, acc: torch.Tensor, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Continue a left fold from `acc` over `tensors` (no AVG division). `acc` is not modified."""
    _check(op, [acc, *tensors])
    if not tensors:
        return acc.clone()
    if _uses_kernel(acc) and all(_uses_kernel(t) for t in tensors):
        from prism.runtime.emulate import fold_cuda
        return fold_cuda.fold([acc, *tensors], op)
    if _uses_kernel(acc) or any(_uses_kernel(t) for t in tensors):
        # host and device contributions (the emulated sandbox's chain: a host accumulator, live CUDA
        # tensors): the kernel reads both and writes the result to pinned host memory, allocating nothing
        # on the device
        from prism.runtime.emulate import fold_cuda
        return fold_cuda.fold_to_host([acc, *tensors], op)
    step = _FOLD[op]
    for t in tensors:
        acc = step(acc, t)
    return acc


def prefold(op: RedOp, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Left fold of a run of contributions (no AVG division): what a leading run's compensator supplies."""
    _check(op, tensors)
    if len(tensors) == 1:
        return tensors[0].clone()
    return fold_from(op, tensors[0], tensors[1:])


def finish(op: RedOp, acc: torch.Tensor, n: int) -> torch.Tensor:
    """The fold's final step: AVG divides by the group size `n` (true division on floats, floor on
    integers, as `semantics.reduce` does on CPU); every other op returns `acc` unchanged."""
    if op != RedOp.AVG:
        return acc
    if n <= 0:
        raise ValueError(f"AVG over {n} members: the group size must be positive")
    if _uses_kernel(acc):
        from prism.runtime.emulate import fold_cuda
        return fold_cuda.finish_avg(acc, n)
    return acc / n if acc.is_floating_point() else acc // n


def fold(op: RedOp, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """All n members' contributions in group order -> the reduction, bitwise `semantics.reduce`."""
    return finish(op, prefold(op, parts), len(parts))


def fold_chunks(op: RedOp, parts: Sequence[torch.Tensor], n: int, chunks: Sequence[int]) -> list[torch.Tensor]:
    """The reduce-scatter chunks `chunks` of flat inputs split into `n` equal chunks (dim 0), each folded
    over its own chunk views exactly as `semantics.reduce_scatter_chunk` does."""
    out = []
    for c in chunks:
        views = [t.reshape(n, -1)[c] for t in parts]
        out.append(fold(op, views))
    return out


def pruned_members(members: Sequence[int], sandbox: Sequence[int] | set[int]) -> list[tuple[int, list[int]]]:
    """Participants of a pruned collective, in group order: ``(rank, [rank])`` for a sandbox member and
    ``(compensator, run)`` for each maximal run of consecutive virtual members (the compensator is the
    run's first member). Runs are taken in group (fold) order, not cyclically: a run that would wrap
    from the last members to the first is two runs here (the leading one pre-folds, the trailing one
    continues the fold after the last sandbox member); one replay peer may host both.
    """
    inside = set(sandbox)
    if len(set(members)) != len(members):
        raise ValueError(f"group members repeat: {list(members)}")
    out: list[tuple[int, list[int]]] = []
    run: list[int] = []
    for m in members:
        if m in inside:
            if run:
                out.append((run[0], run))
                run = []
            out.append((m, [m]))
        else:
            run.append(m)
    if run:
        out.append((run[0], run))
    return out


def is_sandbox(participant: tuple[int, list[int]], sandbox: Sequence[int] | set[int]) -> bool:
    rank, run = participant
    return len(run) == 1 and rank in set(sandbox)
