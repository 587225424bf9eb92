"""The CUDA fold kernel's build step refuses clearly when something it needs is missing (no CUDA here)."""

import pytest
from torch.utils import cpp_extension

from prism.runtime.emulate import fold_cuda


def test_sources_are_where_the_loader_looks():
    assert (fold_cuda.SOURCES / "fold.cu").is_file() and (fold_cuda.SOURCES / "fold_binding.cpp").is_file()
    assert "--fmad=false" in fold_cuda.NVCC_FLAGS and "arch=compute_90,code=sm_90" in fold_cuda.NVCC_FLAGS


def test_missing_toolkit_ninja_or_sources_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(fold_cuda.KernelBuildError, match="CUDA_HOME or put nvcc on PATH"):
        fold_cuda._build()
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")

    def no_ninja():
        raise RuntimeError("Ninja is required to load C++ extensions")
    monkeypatch.setattr(cpp_extension, "verify_ninja_availability", no_ninja)
    with pytest.raises(fold_cuda.KernelBuildError, match="pip install ninja"):
        fold_cuda._build()
    monkeypatch.setattr(fold_cuda, "SOURCES", tmp_path)
    with pytest.raises(fold_cuda.KernelBuildError, match="sources missing"):
        fold_cuda._build()
