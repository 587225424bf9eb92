"""The CUDA fold kernel (cuda/fold.cu) against the CPU path, bitwise. Needs a CUDA device, nvcc and ninja:
`python -m pytest -m gpu tests/gpu -q` (the first test builds the kernel, about a minute)."""

import pytest
import torch

from prism.runtime.emulate import compensation as comp
from prism.runtime.semantics import RedOp

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
OPS = [RedOp.SUM, RedOp.AVG, RedOp.MAX, RedOp.MIN, RedOp.PRODUCT]
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    return t.contiguous().view(_BITS[t.element_size()]).cpu()


def assert_same_bits(gpu, cpu, what, nan_bits=True):
    """Bitwise equality; with nan_bits=False a NaN only has to be a NaN on both sides (the NaN an add or a
    multiply makes is the hardware's: x86 gives 0xFFC00000 for inf - inf, CUDA 0x7FFFFFFF)."""
    assert gpu.dtype == cpu.dtype and gpu.shape == cpu.shape, what
    gpu = gpu.cpu()
    differ = bits(gpu) != bits(cpu)
    if not nan_bits:
        assert torch.equal(gpu.isnan(), cpu.isnan()), f"{what}: NaN in different places"
        differ &= ~cpu.isnan()
    diff = differ.nonzero()
    assert diff.numel() == 0, (f"{what}: {diff.numel()} elements differ, first at {diff[0].tolist()}: "
                               f"gpu {gpu.flatten()[diff[0, 0]].item()!r} cpu {cpu.flatten()[diff[0, 0]].item()!r}")


def contributions(gen, dtype, n, numel):
    """Non-zero values over a wide range of magnitudes (sums round, products over/underflow; float16
    turns the largest into inf)."""
    out = []
    for _ in range(n):
        scale = torch.tensor(2.0, dtype=torch.float64) ** torch.randint(-20, 21, (numel,), generator=gen)
        out.append((torch.randn(numel, generator=gen, dtype=torch.float64) * scale + 1e-3).to(dtype))
    return out


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS, ids=lambda o: str(o).split(".")[-1])
def test_kernel_equals_cpu_path(dtype, op):
    gen = torch.Generator().manual_seed(11)
    for n, numel in [(1, 5), (2, 1000), (3, 4097), (8, 100_003), (33, 2048)]:
        xs = contributions(gen, dtype, n, numel)
        cpu = comp.fold(op, xs)
        gpu = comp.fold(op, [x.cuda() for x in xs])
        assert gpu.is_cuda
        exact_nan = op in (RedOp.MAX, RedOp.MIN)   # fp16 overflows to inf: inf - inf, 0 * inf make NaN
        assert_same_bits(gpu, cpu, f"{op} {dtype} n={n} numel={numel}", nan_bits=exact_nan)
        # the pruned chain (prefold of a leading run, fold_from on the device) gives the same bits
        k = n // 2
        if k:
            acc = comp.prefold(op, [x.cuda() for x in xs[:k]])
            chained = comp.finish(op, comp.fold_from(op, acc, [x.cuda() for x in xs[k:]]), n)
            assert_same_bits(chained, cpu, f"chain {op} {dtype} n={n}", nan_bits=exact_nan)


@pytest.mark.parametrize("dtype", FLOATS)
def test_kernel_special_values_follow_the_cpu_vector_rule(dtype):
    """NaN, infinities and signed-zero ties. numel is a multiple of 64, so every CPU element takes torch's
    vectorized path (the kernel's rule; the scalar tail of a CPU op differs: cuda/README.md). MAX/MIN bits
    match exactly, NaN included; SUM/AVG/PRODUCT match exactly except for the payload of a NaN they make."""
    gen = torch.Generator().manual_seed(12)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0], dtype=torch.float64)
    xs = [specials[torch.randint(0, len(specials), (4096,), generator=gen)].to(dtype) for _ in range(5)]
    for op in OPS:
        assert_same_bits(comp.fold(op, [x.cuda() for x in xs]), comp.fold(op, xs), f"{op} {dtype} specials",
                         nan_bits=op in (RedOp.MAX, RedOp.MIN))


@pytest.mark.parametrize("op", [RedOp.SUM, RedOp.AVG, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX,
                                RedOp.BAND, RedOp.BOR, RedOp.BXOR], ids=lambda o: str(o).split(".")[-1])
def test_kernel_int64(op):
    gen = torch.Generator().manual_seed(13)
    xs = [torch.randint(-2**62, 2**62, (3001,), generator=gen, dtype=torch.int64) * 3 for _ in range(6)]
    assert_same_bits(comp.fold(op, [x.cuda() for x in xs]), comp.fold(op, xs), f"{op} int64")


def test_kernel_handles_non_contiguous_and_empty():
    x = torch.randn(64, 32)
    ys = [x.t(), (x * 2).t()]
    assert_same_bits(comp.fold(RedOp.SUM, [y.cuda() for y in ys]), comp.fold(RedOp.SUM, ys), "transposed")
    empty = [torch.empty(0, 3), torch.empty(0, 3)]
    assert comp.fold(RedOp.SUM, [e.cuda() for e in empty]).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", OPS, ids=lambda o: str(o).split(".")[-1])
def test_host_accumulator_with_cuda_contributions_allocates_nothing_on_the_device(dtype, op):
    """The emulated sandbox's chain: a host accumulator continued with live CUDA tensors (and host parts
    received from peers) folds in the kernel into pinned host memory, bitwise the CPU path, and the
    device's caching allocator sees no allocation at all (its peak and its count of allocations unchanged);
    34 contributions take two launches of at most 32 pointers each."""
    gen = torch.Generator().manual_seed(14)
    for n, numel in [(2, 1000), (5, 4097), (34, 2048)]:
        xs = contributions(gen, dtype, n, numel)
        cpu = comp.fold(op, xs)
        live = [x if i % 2 else x.cuda() for i, x in enumerate(xs[1:])]  # CUDA and host, interleaved, CUDA first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_stats()
        got = comp.finish(op, comp.fold_from(op, xs[0], live), n)
        after = torch.cuda.memory_stats()
        assert not got.is_cuda and got.is_pinned() or op == RedOp.AVG
        assert after["allocation.all.allocated"] == before["allocation.all.allocated"], f"{op} n={n}"
        assert after["allocated_bytes.all.peak"] == before["allocated_bytes.all.peak"], f"{op} n={n}"
        assert_same_bits(got, cpu, f"host chain {op} {dtype} n={n}", nan_bits=op in (RedOp.MAX, RedOp.MIN))
