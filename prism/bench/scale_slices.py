"""`prism bench capture --slices`: the stages of Phase 1 after the slice plan, as the pipeline runs them.

For a job captured by `capture_scale.run_one` and planned with `--representative`: every measured slice runs
for real (`prism.slices.run`: its ranks pinned, one core each, the replay server answering for every other
rank with group reduction), the slices' durations and transfers are borrowed by rank class
(`prism.calibrate.from_slices`), the calibration uses them (`prism calibrate --durations --transfers`), and
then `summary` and `report`. Each stage: wall s and max RSS; the slice runs also their count and the slowest
one. The calibrated iteration time (median over iterations >= 1 of the job's iteration, `calibrated/`)
goes in the row: the number the weak-scaling table compares across W.

Weak scaling (`--weak`): the layouts tp2·pp2·ep2·dp(W/4) keep a rank's work fixed (its microbatches, its
layers, its experts) while DP grows with W, so what changes with W is the DP gradient all-reduce's members
(and so its ring) and the EP all-to-all's partners' timing, not the compute.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from prism import job as job_files
from prism.bench.size_stages import folder_bytes

WEAK = {w: (2, 2, w // 4, 2) for w in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)}  # W -> (tp, pp, dp, ep)


def measured_slices(job: Path) -> list[int]:
    import pyarrow.parquet as pq

    plan = pq.read_table(job_files.slice_plan(job), columns=["slice", "measured"]).to_pylist()
    return sorted({r["slice"] for r in plan if r["measured"]})


def calibrated_iteration_s(job: Path, folder: str = "calibrated") -> float | None:
    """The job's iteration time: per iteration >= 1, its slowest rank's duration; the median of those."""
    import pyarrow.parquet as pq

    it = pq.read_table(job_files.calibrated(job, "iterations", folder),
                       columns=["rank", "iteration", "duration_ns"]).to_pylist()
    per: dict[int, int] = {}
    for r in it:
        if r["iteration"] >= 1:
            per[r["iteration"]] = max(per.get(r["iteration"], 0), r["duration_ns"])
    if not per:
        per = {r["iteration"]: r["duration_ns"] for r in it}
    return statistics.median(per.values()) / 1e9 if per else None


def replay_lateness(job: Path, k: int) -> list[dict]:
    """What slice k's replay server played against its slice ranks (`prism.slices.replay_ops.lateness`), per op
    kind and virtual members: kept in the row, since the bench removes each size's job."""
    from prism import artifacts
    from prism.slices import replay_ops

    ops = replay_ops.read(job_files.slice_file(job, k, "replay_ops.parquet"))
    if ops is None:
        return []
    return replay_ops.lateness(ops, artifacts.read_parquet(job_files.slice_file(job, k)))


def run(job: Path, stages) -> None:
    """The stages after the plan, into `stages.row` (`capture_scale.Stages`: each stage's numbers stay in the
    row whatever a later one does). The slice runs: their count, the ones that ran, the slowest."""
    py, row = sys.executable, stages.row
    if stages.failed:
        return
    if job_files.calibrated_dir(job).exists():  # the bare graph's calibration (the bench's former one), for comparison
        row["bare_iteration_s"] = calibrated_iteration_s(job)
    ks = measured_slices(job)
    row["slice_runs"], row["slice_runs_done"], row["slice_run_max_s"], row["slices_run_rss"] = len(ks), 0, 0.0, 0
    start = time.monotonic()
    for k in ks:
        ok = stages.run("slice", [py, "-m", "prism.slices.run", "--job", str(job), "--slice", str(k)],
                        f"slice run {k}")
        row["slices_run_s"] = time.monotonic() - start
        if not ok:
            return
        row["slice_runs_done"] += 1
        row.setdefault("replay_ops", []).extend(dict(r, slice=k) for r in replay_lateness(job, k))
        row["slice_run_max_s"] = max(row["slice_run_max_s"], row.pop("slice_s"))
        row["slices_run_rss"] = max(row["slices_run_rss"], row.pop("slice_rss"))
        stages.save(row)
    stages.run("from_slices", [py, "-m", "prism.calibrate.from_slices", "--job", str(job)],
               "durations from the slices")
    if stages.run("calibrate", [py, "-m", "prism.cli", "calibrate", "--job", str(job), "--durations",
                                str(job_files.own_durations(job)), "--transfers", str(job_files.slice_transfers(job))],
                  "calibrate from the slices"):
        row["calibrated_bytes"] = folder_bytes(job_files.calibrated_dir(job))
        row["slices_bytes"] = folder_bytes(job_files.slices_dir(job))
        row["iteration_s"] = calibrated_iteration_s(job)
        stages.save(row)


def after_emulate(job: Path, stages) -> None:
    py = sys.executable
    stages.run("summary", [py, "-m", "prism.cli", "summary", "--job", str(job)], "summary")
    if stages.run("report", [py, "-m", "prism.cli", "report", "--job", str(job)], "report"):
        stages.row["report_bytes"] = folder_bytes(job_files.report_dir(job))
        stages.save(stages.row)
