"""prism/runtime/unsupported.py in one process: which backends, reductions and layouts are refused, and the
supervisor's one line (the multi-process behaviour: tests/integration/test_unsupported_features.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from prism.runtime import semantics, unsupported
from prism.runtime.unsupported import UnsupportedFeature


@pytest.mark.parametrize("asked", ["gloo", "nccl", "cpu:gloo,cuda:nccl", "cuda:nccl", "undefined", "prism"])
def test_gloo_and_nccl_groups_are_carried(asked):
    unsupported.check_backend(asked, "default_pg")


@pytest.mark.parametrize("asked, named", [("mpi", "'mpi'"), ("cpu:gloo,cuda:ucc", "'ucc'"), ("fake", "'fake'")])
def test_other_backends_are_refused_by_name(monkeypatch, asked, named):
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(UnsupportedFeature) as err:
        unsupported.check_backend(asked, "tp")
    assert str(err.value).startswith(f"rank 3: process group 'tp' asks for backend {asked!r}")
    assert named in str(err.value) and "Fix: " in str(err.value)


def _allreduce_opts(op) -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    return opts


def test_a_reduction_prism_defines_passes_and_premul_sum_is_refused():
    t = torch.ones(4)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
        unsupported.check_op("all_reduce", "0 (default_pg)", [t], ([t], _allreduce_opts(op)), semantics.REDUCTIONS)
    premul = _allreduce_opts(dist._make_nccl_premul_sum(0.5))
    with pytest.raises(UnsupportedFeature, match=r"all_reduce with ReduceOp.PREMUL_SUM in group 0 \(default_pg\)"):
        unsupported.check_op("all_reduce", "0 (default_pg)", [t], ([t], premul), semantics.REDUCTIONS)


def test_sparse_tensors_are_refused():
    s = torch.sparse_coo_tensor([[0]], [1.0], (2,), check_invariants=True)
    with pytest.raises(UnsupportedFeature, match="all_reduce of a sparse_coo tensor"):
        unsupported.check_op("all_reduce", "0", [s], ([s], _allreduce_opts(dist.ReduceOp.SUM)), semantics.REDUCTIONS)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter_tensor", "reduce"])
def test_a_float8_reduction_is_refused_and_a_float8_gather_is_not(op):
    """prism's fold has no float8 add (nor does gloo reduce float8); moving float8 data is carried (as bytes over
    gloo: runtime/float8_over_gloo.py)."""
    t = torch.zeros(4, dtype=torch.float8_e4m3fn)
    with pytest.raises(UnsupportedFeature, match=rf"{op} of a float8_e4m3fn tensor in group 0 \(tp\).*Fix: reduce in "
                                                 "bfloat16 or float32"):
        unsupported.check_op(op, "0 (tp)", [t], ([t], dist.ReduceScatterOptions()), semantics.REDUCTIONS)
    unsupported.check_op("all_gather_into_tensor", "0 (tp)", [t], (t, t, AllgatherOptions()),
                         semantics.REDUCTIONS)
    unsupported.check_op(op, "0 (tp)", [t.to(torch.bfloat16)], ([t], dist.ReduceScatterOptions()), semantics.REDUCTIONS)


def test_the_supervisor_says_it_once_with_the_place_in_the_program(tmp_path):
    try:
        try:
            unsupported.check_backend("mpi", None)
        except UnsupportedFeature as exc:
            raise RuntimeError("a framework's wrapper") from exc  # found through the cause chain
    except RuntimeError as outer:
        assert unsupported.record(outer, 1, tmp_path)
    line = unsupported.finding(tmp_path, 1)
    assert line.startswith("the program uses a feature prism cannot carry: rank ")
    assert f"(at {__file__}:" in line and line.count("Fix: ") == 1
    assert unsupported.finding(tmp_path, 0) is None
    assert not unsupported.record(ValueError("not ours"), 0, tmp_path)


def test_a_group_other_than_the_default_one_is_refused_at_its_first_op(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert unsupported.uncarried("fake") == ["fake"] and unsupported.uncarried("cpu:gloo,cuda:nccl") == []
    with pytest.raises(UnsupportedFeature, match=r"^rank 1: all_gather on process group 'mesh_batch', which asks for "
                                                 r"backend 'fake'"):
        unsupported.check_backend("fake", "mesh_batch", op="all_gather")
