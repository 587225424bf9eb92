"""The emulation's figures, computed once: what the summary, the report and the fidelity bench show.

From ``emulation/iterations.parquet`` (per rank and iteration, 'computed': the calibrate sweep with the sandbox's
measured durations substituted, the job under the sandbox; 'sandbox': each sandbox rank's measured timeline) and
``calibrated/iterations.parquet`` (the prediction), over the iterations every sandbox rank ran for real
(`compared_iterations`), every figure an iteration time by the one definition (`prism.iterations`: the median
over k >= 1 of the gaps between consecutive iteration ends; for one rank, its own ends):

- job: ``predicted_ms`` (calibrated) and ``under_sandbox_ms`` (the 'computed' rows of every rank);
- per sandbox rank: ``measured_ms`` (its 'sandbox' rows: what it took in the emulation, waits included),
  ``predicted_ms`` (calibrated), ``program_ms`` (the same rank in the job under the sandbox: its own measured
  time, compute, op issue and the waits' own time, plus the waits the sweep gives it from the other ranks'
  progress) and ``delay_ms`` = measured - program: the emulation's own delay, the time the sandbox waited on
  replayed ranks beyond what the job would make it wait (the replay running late in wall-clock time, the
  emulation's transport). The job-level figure carries ``program_ms``; ``delay_ms`` is the emulation's
  overhead on the sandbox, reported beside it and never added to the job.

The emulate stage writes them as ``emulation/figures.parquet`` (`figures_table`; `prism sql`'s
``emulation.figures``), from this same code.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism import artifacts
from prism import job as job_files
from prism.iterations import job_iteration_ends


def _strings(column) -> list[str]:
    return column.cast(pa.string()).to_pylist() if pa.types.is_dictionary(column.type) else column.to_pylist()


def _of_source(iterations: pa.Table, source: str) -> pa.Table:
    return iterations.filter(pa.array([s == source for s in _strings(iterations["source"])], pa.bool_()))


def _of_rank(iterations: pa.Table, rank: int) -> pa.Table:
    return iterations.filter(pc.equal(iterations["rank"], pa.scalar(rank, iterations["rank"].type)))


def job_iteration_ns(iterations: pa.Table, keep: list[int] | None = None) -> dict[int, int]:
    """Per iteration k >= 1, the job's iteration time over the ranks in `iterations` (rank, iteration, end_ns):
    the gap between the ends of iterations k-1 and k (`prism.iterations`), among the iterations in `keep`."""
    it = np.asarray(iterations["iteration"].to_pylist(), dtype=np.int64)
    end = np.asarray(iterations["end_ns"].to_pylist(), dtype=np.int64)
    if keep is not None:
        mask = np.isin(it, np.asarray(list(keep), dtype=np.int64))
        it, end = it[mask], end[mask]
    keys = np.unique(it)
    ends = job_iteration_ends(it, end)
    return {int(k): int(b - a) for k, a, b in zip(keys[1:], ends[:-1], ends[1:])}


def median_ms(per_iter: dict[int, int]) -> float | None:
    """The median of iteration times in ns (None without any)."""
    vals = list(per_iter.values())
    return statistics.median(vals) / 1e6 if vals else None


def compared_iterations(iterations: pa.Table) -> list[int]:
    """The iterations every sandbox rank ran for real (its 'sandbox' rows), ascending."""
    sandbox = _of_source(iterations, "sandbox")
    sets = [set(_of_rank(sandbox, r)["iteration"].to_pylist()) for r in sorted(set(sandbox["rank"].to_pylist()))]
    return sorted(set.intersection(*sets)) if sets else []


@dataclass(frozen=True)
class SandboxRank:
    """One sandbox rank's iteration time (ms), see the module docstring."""

    rank: int
    measured_ms: float | None
    predicted_ms: float | None
    program_ms: float | None

    @property
    def delay_ms(self) -> float | None:
        """The emulation's own delay: measured - program."""
        if self.measured_ms is None or self.program_ms is None:
            return None
        return self.measured_ms - self.program_ms

    @property
    def error_pct(self) -> float | None:
        """The measured time against the prediction, % of the prediction."""
        if self.measured_ms is None or not self.predicted_ms:
            return None
        return 100.0 * (self.measured_ms - self.predicted_ms) / self.predicted_ms


@dataclass(frozen=True)
class Figures:
    iterations: list[int]  # the iterations compared
    predicted_ms: float | None  # the job, calibrated
    under_sandbox_ms: float | None  # the job under the sandbox's measured behaviour
    predicted_gaps_ms: list[float]
    under_sandbox_gaps_ms: list[float]
    ranks: list[SandboxRank]

    @property
    def change_pct(self) -> float | None:
        """The job under the sandbox against the prediction, %."""
        if self.under_sandbox_ms is None or not self.predicted_ms:
            return None
        return 100.0 * (self.under_sandbox_ms - self.predicted_ms) / self.predicted_ms


def figures(emulation_iterations: pa.Table, calibrated_iterations: pa.Table) -> Figures:
    """The emulation's figures from its iterations table and the calibrated one (see the module docstring)."""
    keep = compared_iterations(emulation_iterations)
    computed = _of_source(emulation_iterations, "computed")
    sandbox = _of_source(emulation_iterations, "sandbox")
    pred, under = job_iteration_ns(calibrated_iterations, keep), job_iteration_ns(computed, keep)
    ranks = []
    for r in sorted(set(sandbox["rank"].to_pylist())):
        ranks.append(SandboxRank(
            rank=int(r),
            measured_ms=median_ms(job_iteration_ns(_of_rank(sandbox, r), keep)),
            predicted_ms=median_ms(job_iteration_ns(_of_rank(calibrated_iterations, r), keep)),
            program_ms=median_ms(job_iteration_ns(_of_rank(computed, r), keep))))
    return Figures(keep, median_ms(pred), median_ms(under), [v / 1e6 for v in pred.values()],
                   [v / 1e6 for v in under.values()], ranks)


def figures_table(fig: Figures) -> pa.Table:
    """The figures as ``emulation/figures.parquet`` holds them (`prism.schemas.EMULATION_FIGURES`)."""
    rows = [(-1, fig.predicted_ms, fig.under_sandbox_ms, None, None)]
    rows += [(r.rank, r.predicted_ms, r.program_ms, r.measured_ms, r.delay_ms) for r in fig.ranks]
    names = ("rank", "predicted_ms", "under_sandbox_ms", "measured_ms", "delay_ms")
    table = {n: [row[i] for row in rows] for i, n in enumerate(names)}
    table["iterations"] = [fig.iterations] * len(rows)
    return pa.table(table)


def read_figures(job_dir: str | Path) -> Figures:
    """`figures` of the job folder's ``emulation/iterations.parquet`` and ``calibrated/iterations.parquet``."""
    job_dir = Path(job_dir)
    return figures(artifacts.read_parquet(job_files.emulation(job_dir, "iterations.parquet")),
                   artifacts.read_parquet(job_files.calibrated(job_dir, "iterations")))


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} ms"


def _pct(v: float | None, what: str) -> str:
    return "" if v is None else f" ({v:+.1f} % vs {what})"


def text_lines(fig: Figures) -> list[str]:
    """The figures as the summary prints them (and the report shows them)."""
    lines = [
        "job iteration time (median gap between consecutive iteration ends, prism/iterations.py):",
        f"  calibrated prediction:                         {_ms(fig.predicted_ms)}",
        f"  under the sandbox's measured behaviour:        {_ms(fig.under_sandbox_ms)}"
        f"{_pct(fig.change_pct, 'calibrated')}",
        "sandbox ranks' own iteration time (median): measured = program + emulation delay",
    ]
    for r in fig.ranks:
        lines.append(f"  rank {r.rank}: measured {_ms(r.measured_ms)}{_pct(r.error_pct, 'calibrated')}; program "
                     f"{_ms(r.program_ms)} (what the job above carries), emulation delay {_ms(r.delay_ms)} (waiting "
                     f"on replayed ranks late in wall-clock time; not the job's); calibrated prediction "
                     f"{_ms(r.predicted_ms)}")
    return lines


def rank_table(fig: Figures) -> dict[str, list]:
    """The per-rank figures as columns (the report's table)."""
    return {"rank": [r.rank for r in fig.ranks], "measured_ms": [r.measured_ms for r in fig.ranks],
            "predicted_ms": [r.predicted_ms for r in fig.ranks], "error_pct": [r.error_pct for r in fig.ranks],
            "program_ms": [r.program_ms for r in fig.ranks], "delay_ms": [r.delay_ms for r in fig.ranks]}


__all__ = ["Figures", "SandboxRank", "compared_iterations", "figures", "figures_table", "job_iteration_ns", "median_ms", "rank_table", "read_figures",
           "text_lines"]
