"""Collective semantics: the fixed reduction order, against plain Python references; shm encoding."""

import torch
import torch.distributed as dist

from prism.runtime import semantics, shm

R = dist.ReduceOp.RedOpType


def test_reduce_is_a_left_fold_in_group_order():
    xs = [torch.tensor([1e8, 1.0, -3.0]), torch.tensor([1.0, 2.0, 5.0]), torch.tensor([-1e8, 3.0, 1.0])]
    expected = (xs[0] + xs[1]) + xs[2]
    assert torch.equal(semantics.reduce(xs, R.SUM), expected)
    assert torch.equal(semantics.reduce(xs, R.MAX), torch.tensor([1e8, 3.0, 5.0]))
    assert torch.equal(semantics.reduce(xs, R.MIN), torch.tensor([-1e8, 1.0, -3.0]))
    assert torch.equal(semantics.reduce(xs, R.PRODUCT), xs[0] * xs[1] * xs[2])
    assert torch.allclose(semantics.reduce(xs, R.AVG), expected / 3)
    ints = [torch.tensor([6]), torch.tensor([3])]
    assert semantics.reduce(ints, R.BAND).item() == 2 and semantics.reduce(ints, R.BXOR).item() == 5


def test_reduce_does_not_modify_inputs():
    xs = [torch.ones(3), torch.ones(3)]
    semantics.reduce(xs, R.SUM)
    assert torch.equal(xs[0], torch.ones(3))


def test_reduce_scatter_chunk():
    xs = [torch.arange(6.0), torch.arange(6.0) * 10]
    assert semantics.reduce_scatter_chunk(xs, R.SUM, 1, 3).tolist() == [22.0, 33.0]


def test_all_to_all_single_uneven():
    a = torch.tensor([0.0, 1.0, 2.0])   # member 0 sends [0] to 0, [1, 2] to 1
    b = torch.tensor([10.0, 11.0])      # member 1 sends [10, 11] to 0, nothing to 1
    assert semantics.all_to_all_single([a, b], [[1, 2], [2, 0]], 0).tolist() == [0.0, 10.0, 11.0]
    assert semantics.all_to_all_single([a, b], [[1, 2], [2, 0]], 1).tolist() == [1.0, 2.0]


def test_shm_roundtrip_keeps_dtype_shape_and_meta(tmp_path):
    ts = [torch.randn(2, 3), torch.arange(4, dtype=torch.int64), torch.randn(3).to(torch.bfloat16),
          torch.empty(0, 5)]
    path = tmp_path / "c"
    shm.write(path, shm.encode(ts, {"splits": [1, 2]}))
    meta, back = shm.read(path)
    assert meta == {"splits": [1, 2]}
    for a, b in zip(ts, back):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_payload_store_keeps_each_content_once(tmp_path):
    store = shm.PayloadStore(tmp_path)
    d1 = store.put(shm.encode([torch.ones(4)]))
    d2 = store.put(shm.encode([torch.ones(4)]))
    d3 = store.put(shm.encode([torch.zeros(4)]))
    assert d1 == d2 != d3
    assert len(list(tmp_path.rglob("*.bin"))) == 2
    assert torch.equal(store.get(d3)[1][0], torch.zeros(4))
