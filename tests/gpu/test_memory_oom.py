"""Memory fidelity and OOM reproduction on one GPU (tests/gpu/memory_fidelity.py does the runs): the real GPU
run is the truth, but its per-rank peak varies run to run on some ranks (gloo's staging of async CUDA
collectives), so it runs REAL_RUNS times per layout and each rank's per-rank peak allocated memory from
capture must lie inside the truth's spread, min - 0.01 % <= capture <= max + 0.01 % (on a rank whose truth
did not vary: equal to it within 0.01 %, the goal); the error against the truth's max is reported beside
it (memory_fidelity.md), not asserted where the truth itself varied. Under a per-rank limit
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

REAL_RUNS = 3  # real runs per layout: the truth's spread


def test_memory_fidelity_and_oom(tmp_path: Path) -> None:
    out = Path(os.environ.get("PRISM_GPU_TABLES") or tmp_path)
    rows, found = memory_fidelity.run(out, real_runs=REAL_RUNS)
    print(memory_fidelity.table(rows, found))
    assert rows and all(len(r["real_peak_allocated_runs"]) == REAL_RUNS for r in rows)
    assert all(r["allocated_within_truth"] for r in rows), memory_fidelity.table(rows, None)
    steady = [r for r in rows if min(r["real_peak_allocated_runs"]) == r["real_peak_allocated"]]
    assert all(r["allocated_error_pct"] < 0.01 for r in steady), memory_fidelity.table(steady, None)
    for mode in ("real", "capture"):
        assert found[mode]["exit_code"] == oom.EXIT_CODE, found[mode]["stderr_tail"]
        assert found[mode]["ooms"] and found[mode]["ooms"][0]["rank"] == found["expected_rank"], found[mode]
        assert found[mode]["ooms"][0]["requested_bytes"] > 0 and found[mode]["ooms"][0]["iteration"] >= 0
    assert found["same"], memory_fidelity.table(rows, found)
