"""What-if: the sandbox runs a changed program (20 ms more compute per microbatch on one rank); the job's
emulated iteration time grows by what the calibrated sweep predicts for the same extra duration on that
rank, within the sandbox's own run-to-run spread, and the growth differs between a rank on the critical
path (the last pipeline stage: every microbatch's extra work delays the step) and one partly off it (the
first stage: the extra work of its later microbatches fills time it spends waiting for the heavy last
stage, whose vocabulary projection dominates).

W=2, PP=2, 4 microbatches, calibrated from a slice run of both ranks. For each sandbox rank, two real
emulations (`prism emulate`): one of the changed program (``--what-if-args``), one unchanged: how far the
unchanged one moves the prediction from the calibrated one, plus how far the changed one's iterations
scatter, is the sandbox's run-to-run spread (on a loaded 2-core machine, tens of ms).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from prism.calibrate import substitute
from prism.job import iterations_table, load_graph
from prism.emulate import outputs, stage
from tests.conftest import REPO, make_env, run_prism

pytestmark = pytest.mark.slow

X_MS = 20
MICROBATCHES = 4
WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--pp", "2", "--steps", "6", "--microbatches", str(MICROBATCHES),
            "--hidden", "64", "--ffn-hidden", "32", "--seq-len", "16", "--vocab", "16384", "--heads", "2",
            "--kv-heads", "2", "--layers", "2", "--experts", "2", "--topk", "1"]


def prism(*args: str) -> None:
    proc = run_prism(list(args), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def steady(per_iter: dict[int, int]) -> dict[int, int]:
    return {k: v for k, v in per_iter.items() if k >= 1}


def predicted(graph, durations, transfers) -> dict[int, int]:
    return steady(outputs.job_iteration_ns(iterations_table(graph, substitute.sweep(graph, durations, transfers))))


def emulated(job: Path, rank: int, *what_if: str) -> dict[int, int]:
    """The emulated job's iteration time (the substituted sweep) with `rank` as the sandbox."""
    em, _ = stage.emulate(job, str(rank), devices=1, force=True, what_if=list(what_if))
    it = em.tables["iterations"]
    return steady(outputs.job_iteration_ns(it.filter(pc.equal(it["source"].cast(pa.string()), "computed"))))


@pytest.mark.timeout(900)  # a capture, a slice run and four emulations
# It compares wall-clock emulations with the sweep on a 2-core box: a neighbour's load can push one run outside
# the run-to-run spread it measures (seen once at 21.5 vs 17.0 ms while other emulations ran beside it), so a
# failure is run once more, whole (new capture, new emulations); two failures in a row fail the suite.
@pytest.mark.flaky(reruns=1)
def test_extra_compute_grows_the_job_as_the_sweep_predicts(tmp_path):
    job = tmp_path / "job"
    prism("launch", "--nproc", "2", "--mode", "capture", "--devices", "2", "--out", str(job), *WORKLOAD)
    prism("graph", "--job", str(job))
    prism("calibrate", "--job", str(job))  # numba warm-up; the slice-calibrated sweep follows
    for cmd in (["prism.slices.plan", "--job", str(job), "--devices", "2"],
                ["prism.slices.run", "--job", str(job), "--slice", "0"],
                ["prism.calibrate.from_slices", "--job", str(job)]):
        proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, timeout=600, cwd=REPO,
                              env=make_env())
        assert proc.returncode == 0, proc.stderr[-3000:]

    graph = load_graph(job)
    durations, transfers, source = substitute.calibrated_inputs(job, graph)
    assert source.startswith("slice runs")
    calibrated = predicted(graph, durations, transfers)
    growth = {}
    for rank in (0, 1):
        want = predicted(graph, substitute.lengthen_after_marker(graph, durations, rank, X_MS * 10**6), transfers)
        base = emulated(job, rank)
        more = emulated(job, rank, "--extra-compute-ms", str(X_MS), "--extra-compute-rank", str(rank))
        grew = statistics.median(more[k] - calibrated[k] for k in more)
        expect = statistics.median(want[k] - calibrated[k] for k in want)
        # the sandbox's own run-to-run spread: the growth compares the changed run with the calibration's run,
        # each off by its own noise: how far an unchanged run moves the prediction, plus how far the changed
        # run's iterations scatter around their median growth
        spread = (max(abs(base[k] - calibrated[k]) for k in base)
                  + max(abs(more[k] - calibrated[k] - grew) for k in more))
        print(f"rank {rank}: emulated growth {grew / 1e6:.1f} ms, predicted {expect / 1e6:.1f} ms, "
              f"run-to-run spread {spread / 1e6:.1f} ms")
        assert abs(grew - expect) <= spread, rank
        growth[rank] = (grew, expect)
    # the last stage is on the critical path: all its extra work shows; the first stage hides some of it
    assert abs(growth[1][1] - MICROBATCHES * X_MS * 10**6) <= 10**6
    assert growth[0][1] < growth[1][1] - X_MS * 10**6 / 2
    assert growth[0][0] < growth[1][0]
