"""Memory fidelity and OOM reproduction on one GPU (tests/gpu/memory_fidelity.py does the runs): per-rank
peak allocated memory from capture equals the real GPU run's within 0.01 %, and under a per-rank limit
that one rank cannot meet, capture reports the same out-of-memory error (rank, iteration, microbatch,
marker, requested bytes) as the real run, both exiting oom.EXIT_CODE. Tables go to $PRISM_GPU_TABLES
(default: the test's temporary folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prism.runtime import oom
from tests.gpu import memory_fidelity
from tests.gpu.gpu_env import requires_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.slow, requires_cuda]


def test_memory_fidelity_and_oom(tmp_path: Path) -> None:
    out = Path(os.environ.get("PRISM_GPU_TABLES") or tmp_path)
    rows, found = memory_fidelity.run(out)
    print(memory_fidelity.table(rows, found))
    assert rows and all(r["allocated_error_pct"] < 0.01 for r in rows), memory_fidelity.table(rows, None)
    for mode in ("real", "capture"):
        assert found[mode]["exit_code"] == oom.EXIT_CODE, found[mode]["stderr_tail"]
        assert found[mode]["ooms"] and found[mode]["ooms"][0]["rank"] == found["expected_rank"], found[mode]
        assert found[mode]["ooms"][0]["requested_bytes"] > 0 and found[mode]["ooms"][0]["iteration"] >= 0
    assert found["same"], memory_fidelity.table(rows, found)
