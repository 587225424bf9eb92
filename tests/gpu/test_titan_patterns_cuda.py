"""torchtitan 0.2.2's CUDA patterns (`tests/programs/titan_cuda_patterns.py`) through capture, slices and
emulate with the 4 ranks on GPU 0 (issue 21 item 3: torchtitan's slices and emulation hung on the H200 while the
reference workload's, which asks for gloo, passed). The program asks for "nccl" (torchtitan's), for gloo (the
reference's), and for "nccl" with `device_id` (eager init): every run exits 0 within its bound under a 20 s hang
timeout, the slices print the capture's losses and the sandbox rank 1 the capture's, bitwise. The emulation's
fold kernel is built before the program runs (`fold_cuda.build_before_run`): the build folder is a fresh one
here (one for the module), as on a new host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu.gpu_env import NCCL_ENV, requires_cuda
from tests.integration.test_titan_patterns import check, pipeline

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]

VARIANTS = {"nccl": ["--backend", "nccl"], "gloo": ["--backend", "gloo"],
            "nccl-device-id": ["--backend", "nccl", "--device-id"]}


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fold-build")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_titan_patterns_through_slices_and_emulate_on_cuda(variant: str, tmp_path: Path, build_dir: Path) -> None:
    check(pipeline(tmp_path / "job", "cuda", [*VARIANTS[variant], "--gpus", "1"], CUDA_VISIBLE_DEVICES="0",
                   PRISM_CUDA_BUILD_DIR=str(build_dir), **NCCL_ENV))
