"""What-if: the sandbox runs a changed program (20 ms more compute per microbatch on one rank); the job's
emulated iteration time grows by what the calibrated sweep predicts for the same extra duration on that
rank, within the sandbox's own run-to-run spread, and the growth differs between a rank on the critical
path (the last pipeline stage: every microbatch's extra work delays the step) and one partly off it (the
first stage: the extra work of all but its first microbatch fills time it would spend waiting).

W=2, PP=2, 4 microbatches. The sandbox's measurements are real runs of the program (`recorded_launcher`):
run B with ``--extra-compute-ms 20`` on both ranks, run C unchanged (its scatter is the spread); the job is
captured and calibrated from run A.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism.calibrate import substitute
from prism.calibrate.stage import iterations_table, load_graph
from prism.emulate import outputs, stage
from tests.conftest import run_prism
from tests.integration.emulate_fake import recorded_launcher

pytestmark = pytest.mark.slow

EXTRA_MS = 20
MICROBATCHES = 4
WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--pp", "2", "--steps", "4", "--microbatches", str(MICROBATCHES),
            "--hidden", "32", "--ffn-hidden", "32", "--seq-len", "16", "--vocab", "64", "--heads", "2",
            "--kv-heads", "2", "--layers", "2", "--experts", "2", "--topk", "1"]


def capture(out: Path, *extra: str) -> Path:
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "2", "--out", str(out),
                      *WORKLOAD, *extra], timeout=400)
    assert proc.returncode == 0, proc.stderr
    return out


def steady(per_iter: dict[int, int]) -> dict[int, int]:
    return {k: v for k, v in per_iter.items() if k >= 1}


def emulated(job: Path, run: Path, rank: int) -> dict[int, int]:
    """The stage's job iteration time (the substituted sweep) with `run`'s measurement of `rank`."""
    em, _ = stage.emulate(job, str(rank), force=True, launch=recorded_launcher(run, [rank]))
    it = em.tables["iterations"]
    return steady(outputs.job_iteration_ns(it.filter(pc.equal(it["source"].cast(pa.string()), "computed"))))


def test_extra_compute_grows_the_job_as_the_sweep_predicts(tmp_path):
    job = capture(tmp_path / "A")
    assert run_prism(["graph", "--job", str(job)]).returncode == 0
    assert run_prism(["calibrate", "--job", str(job)], timeout=300).returncode == 0
    changed = capture(tmp_path / "B", "--extra-compute-ms", str(EXTRA_MS), "--extra-compute-rank", "0,1")
    plain = capture(tmp_path / "C")

    graph = load_graph(job)
    durations, transfers, _ = substitute.calibrated_inputs(job, graph)
    calibrated = steady(outputs.job_iteration_ns(iterations_table(graph, substitute.sweep(graph, durations,
                                                                                           transfers))))
    growth = {}
    for rank in (0, 1):
        whatif = substitute.lengthen_after_marker(graph, durations, rank, EXTRA_MS * 10**6)
        predicted = steady(outputs.job_iteration_ns(iterations_table(graph, substitute.sweep(graph, whatif,
                                                                                               transfers))))
        base, more = emulated(job, plain, rank), emulated(job, changed, rank)
        spread = max(base[k] - calibrated[k] for k in base) - min(base[k] - calibrated[k] for k in base)
        grew = statistics.median(more.values()) - statistics.median(base.values())
        want = statistics.median(predicted[k] - calibrated[k] for k in predicted)
        print(f"rank {rank}: emulated growth {grew / 1e6:.1f} ms, predicted {want / 1e6:.1f} ms, "
              f"spread {spread / 1e6:.1f} ms")
        assert abs(grew - want) <= max(spread, 2 * 10**6), rank
        growth[rank] = want
    # the last stage is on the critical path: all of its extra work shows; the first stage hides some of it
    assert abs(growth[1] - MICROBATCHES * EXTRA_MS * 10**6) <= 10**6
    assert growth[0] < growth[1] - EXTRA_MS * 10**6 / 2
