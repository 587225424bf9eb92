"""The CUDA fold kernel of `cuda/fold.cu`, built on first use with torch's extension tooling (JIT, sm_90).

Built by an emulated sandbox rank on CUDA before its program's first collective (`build_before_run`), else
when a CUDA tensor first reaches `compensation`; CPU runs and CI never build it. Flags: Hopper
machine code (`-gencode arch=compute_90,code=sm_90`), no fast math, no FMA contraction (`--fmad=false`),
IEEE division, no flush to zero, so each step rounds like torch's own ops. The build needs `nvcc`
(CUDA_HOME or on PATH) and `ninja` (torch.utils.cpp_extension.load refuses to build without it);
`PRISM_CUDA_BUILD_DIR` overrides torch's default build folder (~/.cache/torch_extensions).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Sequence

import torch

from prism import settings
from prism.runtime.semantics import RedOp

SOURCES = Path(__file__).resolve().parents[3] / "cuda"
NVCC_FLAGS = ["-O3", "-gencode", "arch=compute_90,code=sm_90", "--fmad=false", "-ftz=false",
              "-prec-div=true", "-prec-sqrt=true"]
OP_CODES = {RedOp.SUM: 0, RedOp.AVG: 0, RedOp.PRODUCT: 1, RedOp.MIN: 2, RedOp.MAX: 3,
            RedOp.BAND: 4, RedOp.BOR: 5, RedOp.BXOR: 6}

_lock = threading.Lock()
_module = None
launches = 0  # fold and finish_avg calls in this process (emulation's meta.json: `cuda_folds`)


class KernelBuildError(RuntimeError):
    """The CUDA fold kernel could not be built (the message says what is missing)."""


def _build():
    from torch.utils import cpp_extension
    sources = [SOURCES / "fold_binding.cpp", SOURCES / "fold.cu"]
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise KernelBuildError(f"CUDA fold sources missing: {', '.join(missing)} (prism's cuda/ folder must sit "
                               f"beside the prism package: install prism from its checkout with pip install -e)")
    if cpp_extension.CUDA_HOME is None:
        raise KernelBuildError("no CUDA toolkit found to build the fold kernel: set CUDA_HOME or put nvcc on PATH")
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError as e:
        raise KernelBuildError("building the CUDA fold kernel needs ninja: pip install ninja") from e
    build_dir = settings.CUDA_BUILD_DIR.get()
    if build_dir:
        Path(build_dir).mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(name="prism_fold", sources=[str(s) for s in sources],
                              extra_cflags=["-O2"], extra_cuda_cflags=NVCC_FLAGS,
                              build_directory=build_dir, verbose=settings.CUDA_VERBOSE.is_set())


def module():
    """The loaded extension (built once per process, under a lock: the replay worker has many threads)."""
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                _module = _build()
    return _module


def build_before_run() -> None:
    """On a CUDA rank: the kernel built now, before the program's first collective (emulate's sandbox calls it
    at its first group, before the common start and the hang watchdog). Built at the first fold instead, its
    minute of nvcc ran inside a collective: the hang watchdog saw no op complete and no compute on the
    program's thread and stopped the run (session 12's H200 call: torchtitan's sandbox rank 1 stopped in
    `all_reduce #0` after 60 s), and a timed emulation would count the build into that op. A host that cannot
    build it is told here and the run goes on: a sandbox that never folds CUDA contributions needs no kernel,
    one that does fails at that fold, naming the cause."""
    if settings.DEVICE.get() != "cuda" and not torch.cuda.is_initialized():
        return
    try:
        module()
    except (RuntimeError, OSError) as exc:  # KernelBuildError, or the compiler's own failure
        print(f"[prism] emulate: the CUDA fold kernel could not be built before the run: {exc}; a reduction "
              "that folds CUDA contributions will fail with this error", file=sys.stderr, flush=True)


def fold(tensors: Sequence[torch.Tensor], op: RedOp) -> torch.Tensor:
    """Left fold of `tensors` (no AVG division) on their CUDA device."""
    global launches
    out = module().fold(list(tensors), OP_CODES[op])
    launches += 1
    return out


def pinned(t: torch.Tensor) -> torch.Tensor:
    """`t` in pinned host memory (itself when it is already there and contiguous): what the kernel can read."""
    if t.is_pinned() and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


def fold_to_host(tensors: Sequence[torch.Tensor], op: RedOp) -> torch.Tensor:
    """Left fold (no AVG division) of CUDA and host contributions by the kernel, which reads host ones in
    pinned memory and writes the result to pinned host memory: no allocation on the device, so a rank's
    caching allocator sees only the program's own tensors (prism's emulated sandbox, docs/gpu.md)."""
    global launches
    parts = [t.contiguous() if t.is_cuda else pinned(t) for t in tensors]
    out = torch.empty(parts[0].shape, dtype=parts[0].dtype, pin_memory=True)
    module().fold_into(parts, out, OP_CODES[op])
    launches += 1
    return out


def finish_avg(acc: torch.Tensor, n: int) -> torch.Tensor:
    """AVG's final division by the group size, as the CPU path divides."""
    global launches
    out = module().finish_avg(acc, int(n))
    launches += 1
    return out
