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

WEAK = {w: (2, 2, w // 4, 2) for w in (16, 64, 128, 1024, 2048, 4096, 8192)}  # W -> (tp, pp, dp, ep)


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def measured_slices(job: Path) -> list[int]:
    import pyarrow.parquet as pq

    plan = pq.read_table(job / "slices" / "plan.parquet", columns=["slice", "measured"]).to_pylist()
    return sorted({r["slice"] for r in plan if r["measured"]})


def calibrated_iteration_s(job: Path, folder: str = "calibrated") -> float | None:
    """The job's iteration time: per iteration >= 1, its slowest rank's duration; the median of those."""
    import pyarrow.parquet as pq

    it = pq.read_table(job / folder / "iterations.parquet", columns=["rank", "iteration", "duration_ns"]).to_pylist()
    per: dict[int, int] = {}
    for r in it:
        if r["iteration"] >= 1:
            per[r["iteration"]] = max(per.get(r["iteration"], 0), r["duration_ns"])
    if not per:
        per = {r["iteration"]: r["duration_ns"] for r in it}
    return statistics.median(per.values()) / 1e9 if per else None


def run(job: Path, stage, left) -> dict:
    """The stages after the plan. `stage(cmd, what, timeout) -> (wall, rss)`; `left()`: seconds of budget."""
    py = sys.executable
    row: dict = {}
    if (job / "calibrated").exists():  # the bare graph's calibration (the bench's former one), for comparison
        row["bare_iteration_s"] = calibrated_iteration_s(job)
    ks = measured_slices(job)
    start, slowest, rss = time.monotonic(), 0.0, 0
    for k in ks:
        wall, peak = stage([py, "-m", "prism.slices.run", "--job", str(job), "--slice", str(k)], f"slice run {k}",
                           left())
        slowest, rss = max(slowest, wall), max(rss, peak)
    row.update(slice_runs=len(ks), slices_run_s=time.monotonic() - start, slice_run_max_s=slowest,
               slices_run_rss=rss)
    row["from_slices_s"], row["from_slices_rss"] = stage(
        [py, "-m", "prism.calibrate.from_slices", "--job", str(job)], "durations from the slices", left())
    sl = job / "slices"
    row["calibrate_s"], row["calibrate_rss"] = stage(
        [py, "-m", "prism.cli", "calibrate", "--job", str(job), "--durations", str(sl / "durations.parquet"),
         "--transfers", str(sl / "transfers.parquet")], "calibrate from the slices", left())
    row["calibrated_bytes"] = _folder_bytes(job / "calibrated")
    row["slices_bytes"] = _folder_bytes(sl)
    row["iteration_s"] = calibrated_iteration_s(job)
    return row


def after_emulate(job: Path, stage, left) -> dict:
    py = sys.executable
    row = {}
    row["summary_s"], row["summary_rss"] = stage([py, "-m", "prism.cli", "summary", "--job", str(job)], "summary",
                                                 left())
    row["report_s"], row["report_rss"] = stage([py, "-m", "prism.cli", "report", "--job", str(job)], "report", left())
    row["report_bytes"] = _folder_bytes(job / "report")
    return row


def print_tables(rows: list[dict]) -> None:
    gib = 2 ** 30
    staged = [r for r in rows if "slices_run_s" in r]
    if not staged:
        return
    print("\nPhase 1 with slices, per stage: wall s / peak memory GiB (capture: tree PSS; others: max RSS)")
    heads = ["capture", "graph", "plan", "slices (n, slowest s)", "from_slices", "calibrate", "emulate", "summary",
             "report"]
    print(f"{'W':>5} {'layout':<18} " + " ".join(f"{h:>22}" for h in heads) + f" {'iteration s (bare)':>22}")
    for r in staged:
        cells = [(r["wall_s"], r["pss_peak"]), (r["graph_s"], r["graph_rss"]), (r["plan_s"], r["plan_rss"])]
        text = [f"{s:7.1f}/{m / gib:6.2f}" for s, m in cells]
        text.append(f"{r['slices_run_s']:6.1f}/{r['slices_run_rss'] / gib:5.2f} ({r['slice_runs']}, "
                    f"{r['slice_run_max_s']:.1f})")
        text += [f"{r[k + '_s']:7.1f}/{r[k + '_rss'] / gib:6.2f}" for k in ("from_slices", "calibrate")]
        text.append(f"{r['emulate_s']:7.1f}/{r['emulate_pss'] / gib:6.2f}" if "emulate_s" in r else "n/a")
        text += [f"{r[k + '_s']:7.1f}/{r[k + '_rss'] / gib:6.2f}" if k + "_s" in r else "n/a"
                 for k in ("summary", "report")]
        it, bare = r.get("iteration_s"), r.get("bare_iteration_s")
        its = f"{it:.4f} ({bare:.3f})" if it is not None and bare is not None else f"{it}"
        print(f"{r['W']:>5} {r['layout']:<18} " + " ".join(f"{t:>22}" for t in text) + f" {its:>22}")
