"""Emulated collectives of a group of sandbox ranks only run as native gloo ops (`native_group`), the rest
through the pruned protocol: both give, op by op, what prism's semantics define (reductions: the left
fold in group order, bitwise) and data movement gives gloo's bytes. Real processes (W=4) on gloo, through
`prism bench emulate-ops`' harness, whose workers check every output (an AssertionError fails them)."""

from __future__ import annotations

import pytest

from prism.bench import emulate_ops

pytestmark = pytest.mark.slow


def test_native_and_protocol_ops_give_semantics_bits():
    table = emulate_ops.measure(4, 1, emulate_ops.OPS)
    assert {(r["shape"], r["op"]) for r in table} == {(s, o) for s in emulate_ops.SHAPES for o in emulate_ops.OPS}
    assert all(r["emulated_ms"] > 0 and r["gloo_ms"] > 0 for r in table)


def test_the_check_is_bitwise_and_order_sensitive():
    """What the workers compare against: -0.0 is not 0.0, and the all_reduce reference is the left fold
    in group order (another order rounds differently for these inputs)."""
    import torch

    assert not emulate_ops._bitwise(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert emulate_ops._bitwise(torch.tensor([1.5]), torch.tensor([1.5]))
    c = emulate_ops.case("all_reduce", 0, 4)
    want = emulate_ops.expected("all_reduce", 0, 4, c["fresh"](), c)
    ins = [emulate_ops.case("all_reduce", r, 4)["record"][1][0] for r in range(4)]
    assert emulate_ops._bitwise(want, ((ins[0] + ins[1]) + ins[2]) + ins[3])
    assert not emulate_ops._bitwise(want, ((ins[3] + ins[2]) + ins[1]) + ins[0])


def test_a_pairs_all_reduce_is_gloos_own_and_the_left_fold_bitwise():
    """A group of two sandbox members reduces with gloo's own allreduce (`native_group._allreduce`: x0 + x1
    has no order); the workers check its output against the left fold, bitwise."""
    table = emulate_ops.measure(2, 3, ["all_reduce"])
    assert {(r["shape"], r["op"]) for r in table} == {(s, "all_reduce") for s in emulate_ops.SHAPES}
