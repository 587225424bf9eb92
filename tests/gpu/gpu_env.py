"""Helpers of the GPU tests, which run on a host with CUDA (`pytest -m gpu tests/gpu`), skipped elsewhere (see docs/gpu.md)."""

from __future__ import annotations

import os

import pytest
import torch

# NVLink multicast stays off on shared hosts (a program using it can take the host's GPUs out of service)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NCCL_ENV)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
