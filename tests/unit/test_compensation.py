"""Compensation: pruned folds of live + recorded contributions are bitwise `semantics.reduce`."""

import random
import subprocess
import sys

import pytest
import torch

from prism.runtime.emulate import compensation as comp
from prism.runtime import semantics
from prism.runtime.semantics import RedOp

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
FLOAT_OPS = [RedOp.SUM, RedOp.AVG, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX]
INT_OPS = FLOAT_OPS + [RedOp.BAND, RedOp.BOR, RedOp.BXOR]
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (NaN payloads and the sign of zero included)."""
    return t.contiguous().view(_BITS[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def chain(op, xs, sandbox, live):
    """The exact pruned chain: leading run pre-folded, then in group order each sandbox member's live
    contribution and each later run folded onto the travelling accumulator; finish at the end."""
    members = list(range(len(xs)))
    acc = None
    for rank, run in comp.pruned_members(members, sandbox):
        part = [live[rank]] if rank in sandbox else [xs[m] for m in run]
        acc = comp.prefold(op, part) if acc is None else comp.fold_from(op, acc, part)
    return comp.finish(op, acc, len(xs))


# --- hand-computed values -------------------------------------------------------------------------

def test_left_fold_does_not_reassociate_so_a_later_run_must_not_be_prefolded():
    live = torch.tensor([1.0])                          # sandbox member 0
    rec = [torch.tensor([1e8]), torch.tensor([-1e8])]   # the run after it
    # (1 + 1e8) rounds to 1e8 in float32 (spacing 8), so the left fold gives 0, the run pre-folded gives 1.
    assert comp.fold_from(RedOp.SUM, live, rec).item() == 0.0
    assert comp.fold_from(RedOp.SUM, live, [comp.prefold(RedOp.SUM, rec)]).item() == 1.0
    assert comp.fold(RedOp.SUM, [live, *rec]).item() == semantics.reduce([live, *rec], RedOp.SUM).item() == 0.0
    assert not comp.can_prefold(RedOp.SUM, torch.float32, leading=False)


def test_leading_run_prefolds():
    rec = [torch.tensor([1e8]), torch.tensor([1.0])]    # run before the sandbox member
    live = torch.tensor([-1e8])
    acc = comp.prefold(RedOp.SUM, rec)                  # 1e8 + 1 -> 1e8 in float32
    assert acc.item() == 1e8
    assert comp.fold_from(RedOp.SUM, acc, [live]).item() == 0.0


def test_half_types_round_after_each_step():
    xs = [torch.tensor([256.0], dtype=torch.bfloat16), torch.tensor([1.0], dtype=torch.bfloat16),
          torch.tensor([1.0], dtype=torch.bfloat16)]
    # bf16 keeps 8 significant bits: 256 + 1 = 257 is a tie and rounds to even (256), twice; one rounding
    # of the float sum would give 258.
    assert comp.fold(RedOp.SUM, xs).item() == 256.0
    assert semantics.reduce(xs, RedOp.SUM).item() == 256.0


def test_avg_divides_once_by_the_group_size():
    xs = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([4.0])]
    acc = comp.prefold(RedOp.AVG, xs[:2])
    assert acc.item() == 3.0                            # a sum, not yet an average
    assert comp.finish(RedOp.AVG, comp.fold_from(RedOp.AVG, acc, xs[2:]), 3).item() == torch.tensor(7.0 / 3).item()
    ints = [torch.tensor([-7]), torch.tensor([0]), torch.tensor([0])]
    assert comp.fold(RedOp.AVG, ints).item() == -3     # floor division, as semantics does
    assert comp.finish(RedOp.SUM, torch.tensor([5.0]), 3).item() == 5.0


def test_pruned_members_one_compensator_per_run():
    assert comp.pruned_members(range(8), {3, 5}) == [(0, [0, 1, 2]), (3, [3]), (4, [4]), (5, [5]), (6, [6, 7])]
    assert comp.pruned_members([4, 9, 2], {4, 9, 2}) == [(4, [4]), (9, [9]), (2, [2])]
    assert comp.pruned_members([4, 9, 2], set()) == [(4, [4, 9, 2])]
    assert comp.pruned_members([7, 1, 5, 3], {7, 3}) == [(7, [7]), (1, [1, 5]), (3, [3])]
    with pytest.raises(ValueError, match="repeat"):
        comp.pruned_members([1, 1], {1})


def test_can_prefold_table():
    assert comp.can_prefold(RedOp.PRODUCT, torch.bfloat16, leading=True)
    assert not comp.can_prefold(RedOp.AVG, torch.float64, leading=False)
    assert not comp.can_prefold(RedOp.PRODUCT, torch.float16, leading=False)
    assert comp.can_prefold(RedOp.SUM, torch.int64, leading=False)      # wraps modulo 2^64: associative
    assert comp.can_prefold(RedOp.MAX, torch.float32, leading=False)
    assert comp.can_prefold(RedOp.BXOR, torch.int64, leading=False)


def test_bad_input_is_named():
    with pytest.raises(semantics.UnsupportedOp, match="PREMUL_SUM"):
        comp.fold(RedOp.PREMUL_SUM, [torch.ones(2)])
    with pytest.raises(ValueError, match="at least one"):
        comp.prefold(RedOp.SUM, [])
    with pytest.raises(ValueError, match="differ"):
        comp.fold(RedOp.SUM, [torch.ones(2), torch.ones(3)])
    with pytest.raises(ValueError, match="differ"):
        comp.fold(RedOp.SUM, [torch.ones(2), torch.ones(2, dtype=torch.float64)])


def test_inputs_are_not_modified():
    acc, xs = torch.ones(3), [torch.ones(3), torch.ones(3)]
    comp.fold_from(RedOp.SUM, acc, xs)
    comp.fold(RedOp.SUM, xs)
    assert torch.equal(acc, torch.ones(3)) and all(torch.equal(x, torch.ones(3)) for x in xs)


def test_import_builds_no_cuda():
    code = ("import sys, prism.runtime.emulate.compensation, prism.runtime.replay.prefetch; "
            "bad = [m for m in ('prism.runtime.emulate.fold_cuda', 'torch.utils.cpp_extension') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- randomized bitwise comparison against semantics.reduce ----------------------------------------

def contribution(rng: torch.Generator, dtype: torch.dtype, numel: int, special: bool) -> torch.Tensor:
    if dtype == torch.int64:
        return torch.randint(-2**62, 2**62, (numel,), generator=rng, dtype=torch.int64) * 3
    scale = torch.tensor(10.0) ** torch.randint(-6, 7, (numel,), generator=rng)
    t = (torch.randn(numel, generator=rng, dtype=torch.float64) * scale).to(dtype)
    if special:     # signed zeros, infinities and NaN in some places
        pick = torch.randint(0, 12, (numel,), generator=rng)
        t = torch.where(pick == 0, torch.zeros((), dtype=dtype), t)
        t = torch.where(pick == 1, -torch.zeros((), dtype=dtype), t)
        t = torch.where(pick == 2, torch.tensor(float("inf"), dtype=dtype), t)
        t = torch.where(pick == 3, torch.tensor(float("nan"), dtype=dtype), t)
    return t


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_pruned_chain_equals_semantics_bitwise(dtype):
    rng, pyrng = torch.Generator().manual_seed(8), random.Random(8)
    ops = INT_OPS if dtype == torch.int64 else FLOAT_OPS
    for trial in range(60):
        op = ops[trial % len(ops)]
        n = pyrng.randint(1, 9)
        numel = pyrng.choice([1, 7, 64, 100])
        special = trial % 3 == 0 and dtype != torch.int64
        recorded = [contribution(rng, dtype, numel, special) for _ in range(n)]
        sandbox = set(pyrng.sample(range(n), pyrng.randint(0, n)))
        live = {r: contribution(rng, dtype, numel, special) for r in sandbox}
        xs = [live.get(i, recorded[i]) for i in range(n)]
        want = semantics.reduce(xs, op)
        assert same_bits(comp.fold(op, xs), want), (op, dtype, n, sandbox)
        assert same_bits(chain(op, recorded, sandbox, live), want), (op, dtype, n, sandbox)
        # individual contributions after the leading run, folded by the sandbox member itself
        first = min(sandbox, default=n)
        lead = comp.prefold(op, xs[:first]) if first else None
        rest = xs[first:] if lead is not None else xs[1:]
        acc = comp.fold_from(op, lead if lead is not None else xs[0], rest)
        assert same_bits(comp.finish(op, acc, n), want)


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_associative_ops_prefold_every_run(dtype):
    rng, pyrng = torch.Generator().manual_seed(9), random.Random(9)
    ops = [op for op in (INT_OPS if dtype == torch.int64 else FLOAT_OPS) if comp.can_prefold(op, dtype, False)]
    assert ops
    for trial in range(40):
        op = ops[trial % len(ops)]
        n = pyrng.randint(2, 9)
        xs = [contribution(rng, dtype, 67, special=dtype != torch.int64) for _ in range(n)]
        sandbox = set(pyrng.sample(range(n), pyrng.randint(1, n - 1)))
        acc = None
        for rank, run in comp.pruned_members(range(n), sandbox):
            part = comp.prefold(op, [xs[m] for m in run])
            acc = part if acc is None else comp.fold_from(op, acc, [part])
        assert same_bits(comp.finish(op, acc, n), semantics.reduce(xs, op)), (op, dtype, sandbox)


def test_fold_chunks_equals_reduce_scatter_chunk():
    rng = torch.Generator().manual_seed(3)
    for dtype in FLOATS:
        xs = [contribution(rng, dtype, 60, special=True) for _ in range(4)]
        for op in FLOAT_OPS:
            got = comp.fold_chunks(op, xs, 4, range(4))
            for c in range(4):
                assert same_bits(got[c], semantics.reduce_scatter_chunk(xs, op, c, 4))


def test_cpu_min_max_rules_that_the_cuda_kernel_follows():
    """torch's CPU maximum/minimum: the vectorized body returns the second operand on a +0/-0 tie and the
    all-ones NaN; the scalar tail (here the last 3 of 67) the first operand and a canonical NaN. The CUDA
    kernel follows the body's rule (cuda/README.md); this pins the fact it relies on."""
    pos, neg = torch.zeros(67), -torch.zeros(67)
    assert torch.signbit(torch.maximum(pos, neg))[:64].all() and not torch.signbit(torch.maximum(pos, neg))[64:].any()
    assert not torch.signbit(torch.minimum(neg, pos))[:64].any() and torch.signbit(torch.minimum(neg, pos))[64:].all()
    nan = torch.maximum(torch.full((67,), float("nan")), torch.ones(67)).view(torch.int32)
    assert (nan[:64] == -1).all() and (nan[64:] == 0x7FC00000).all()


def test_contributions_on_two_non_cuda_devices_are_refused():
    """Host tensors may meet CUDA tensors of one device (the kernel reads both); any other mix of devices
    (here: CPU and meta) is an error naming both, as before."""
    with pytest.raises(ValueError, match="on cpu vs .* on meta"):
        comp.fold_from(RedOp.SUM, torch.ones(3), [torch.ones(3, device="meta")])
