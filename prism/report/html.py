"""The report page: one self-contained HTML file (plotly's JavaScript inlined once, no network at view time)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from prism import job as job_files
from prism.report import data, plots
from prism.report.critical import iteration_critical_path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; } td, th { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #666; font-size: 0.9em; }
"""


@dataclass
class Page:
    """The report's sections in order; figures are rendered with plotly's JS inlined in the first one."""

    title: str
    parts: list[str] = field(default_factory=list)
    n_figures: int = 0

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str, cls: str = "") -> None:
        self.parts.append(f"<p class='{cls}'>{html.escape(text)}</p>")

    def table(self, frame: pl.DataFrame, floats: str = "{:.2f}") -> None:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
        rows = []
        for row in frame.iter_rows():
            cells = []
            for v in row:
                if isinstance(v, float):
                    cells.append(f"<td class='n'>{floats.format(v)}</td>")
                elif isinstance(v, int):
                    cells.append(f"<td class='n'>{v}</td>")
                else:
                    cells.append(f"<td>{html.escape('' if v is None else str(v))}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")

    def figure(self, fig: go.Figure) -> None:
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=self.n_figures == 0,
                                      div_id=f"prism-plot-{self.n_figures}", config={"displaylogo": False}))
        self.n_figures += 1

    def render(self) -> str:
        body = "\n".join(self.parts)
        return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(self.title)}"
                f"</title><style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def build(job: str | Path) -> str:
    """The report of the job at `job` as one HTML page; `data.ReportError` when the calibrated timeline is
    missing (the report needs the prediction)."""
    job = Path(job)
    calibrated = data.load_timeline(job, "calibrated")
    iters_path = job_files.calibrated(job, "iterations")
    if not iters_path.is_file():
        raise data.ReportError(f"{iters_path} is missing: run the calibrate stage first (prism calibrate --job {job})")
    iterations = pl.read_parquet(iters_path)
    page = Page(f"prism report: {job.name}")
    predicted = data.job_iteration_time(iterations)
    per_rank = data.per_rank_iteration(iterations)

    baseline = emulation = None
    if job_files.graph_file(job_files.baseline(job), "events").is_file():
        baseline = data.load_timeline(job, "baseline")
    if job_files.emulation(job, "events.parquet").is_file():
        emulation = data.load_timeline(job, "emulation")
    base_iters = data.marker_iterations(baseline.events) if baseline else None
    measured = data.job_iteration_time(base_iters) if base_iters is not None and base_iters.height else None

    page.parts.append(f"<h1>{html.escape(page.title)}</h1>")
    page.text(f"{calibrated.world} ranks, {iterations['iteration'].n_unique()} iterations, "
              f"{calibrated.events.height:,} events; from {job.resolve()}", "note")
    summary = [("predicted (calibrated timeline)", predicted)]
    if baseline is not None:
        summary.append(("measured (baseline: the real run)", measured))
    page.heading("Iteration time")
    page.table(pl.DataFrame({
        "timeline": [s for s, _ in summary],
        "median ms": [t["median_ms"] if t else None for _, t in summary],
        "min ms": [t["min_ms"] if t else None for _, t in summary],
        "max ms": [t["max_ms"] if t else None for _, t in summary],
        "iterations": [t["n"] if t else None for _, t in summary],
    }, strict=False))
    page.text("The job's iteration k ends when its last rank ends iteration k; iteration times are the gaps "
              "between consecutive ends, iteration 0 (start-up) left out (prism/iterations.py).", "note")
    if per_rank.height:
        page.figure(plots.iteration_time_per_rank(
            per_rank, predicted["median_ms"] if predicted else None,
            data.per_rank_iteration(base_iters) if base_iters is not None else None))
    else:
        page.text("One iteration only: no per-rank iteration time after the start-up (run more steps).", "note")

    shown = data.shown_iteration(iterations)
    page.heading(f"Critical path and timeline of iteration {shown}")
    try:
        path = iteration_critical_path(job, calibrated.events, shown)
    except ValueError as exc:
        path = None
        page.text(f"critical path not computed: {exc}", "note")
    if path is not None:
        share = (path.with_columns(ms=(pl.col("end_ns") - pl.col("start_ns")) / 1e6)
                 .group_by("rank", "kind").agg(pl.col("ms").sum(), events=pl.len()).sort("ms", descending=True))
        page.text(f"The chain of events that set the end of iteration {shown}: walked back from its last "
                  "iteration_end marker through each event's binding dependency (the comm member that arrived "
                  f"last, or program order; prism/calibrate/critical_path.py). {path.height} events; time on the "
                  "path by rank and kind:")
        page.table(share.head(12))
    page.figure(plots.gantt(data.one_iteration(calibrated.events, iterations, shown), path,
                            f"Predicted timeline of iteration {shown} (black: the critical path)"))

    page.heading("Compute, communication, idle")
    own = job_files.own_durations(job)
    breakdown = data.time_breakdown(calibrated.events, pl.read_parquet(own) if own.is_file() else None)
    if not own.is_file():
        page.text("No slices/durations.parquet: idle time is not separated from communication.", "note")
    page.figure(plots.breakdown(breakdown))

    page.heading("Peak memory per rank")
    mem = data.peak_memory(calibrated.events)
    if mem["peak_mib"].null_count() == mem.height:
        page.text("Memory was not measured in this capture.", "note")
    else:
        page.figure(plots.memory(mem))

    if emulation is not None:
        _emulation_section(page, job, emulation, per_rank, predicted)
    if baseline is not None and base_iters is not None:
        page.heading("Prediction against the baseline (the real run)")
        both = per_rank.rename({"median_ms": "predicted_ms"}).join(
            data.per_rank_iteration(base_iters).rename({"median_ms": "measured_ms"}), on="rank", how="inner")
        both = both.with_columns(error_pct=100 * (pl.col("predicted_ms") - pl.col("measured_ms")) / pl.col("measured_ms"))
        if predicted and measured:
            err = 100 * (predicted["median_ms"] - measured["median_ms"]) / measured["median_ms"]
            page.text(f"Job iteration time: predicted {_ms(predicted['median_ms'])}, measured "
                      f"{_ms(measured['median_ms'])} ({err:+.1f} %).")
        page.table(both)
        page.figure(plots.measured_vs_predicted(both, "Median iteration time per rank: predicted vs baseline",
                                                "baseline"))
        series = {"predicted": predicted["gaps_ms"] if predicted else [],
                  "baseline": measured["gaps_ms"] if measured else []}
        page.figure(plots.iteration_series(series, "The job's iteration times"))
    return page.render()


def _emulation_section(page: Page, job: Path, emulation: data.Timeline, per_rank: pl.DataFrame,
                       predicted: dict | None) -> None:
    page.heading("Emulation: sandbox ranks measured vs predicted")
    ev = emulation.events
    if "source" not in ev.columns:
        page.text(f"{job / 'emulation' / 'events.parquet'} has no source column: sandbox ranks unknown.", "note")
        return
    sandbox = sorted(ev.filter(pl.col("source") == "sandbox")["rank"].unique().to_list())
    path = job_files.emulation(job, "iterations.parquet")
    iters = pl.read_parquet(path) if path.is_file() else data.marker_iterations(ev)
    if "duration_ns" not in iters.columns:
        iters = data.marker_iterations(ev)
    measured = data.per_rank_iteration(iters.filter(pl.col("rank").is_in(sandbox)))
    both = per_rank.rename({"median_ms": "predicted_ms"}).join(
        measured.rename({"median_ms": "measured_ms"}), on="rank", how="inner")
    if not both.height:
        page.text(f"No sandbox rank with iteration times in {job / 'emulation'}.", "note")
        return
    page.text(f"Sandbox ranks (ran for real in the emulation): {', '.join(map(str, sandbox))}.")
    page.table(both.with_columns(
        error_pct=100 * (pl.col("predicted_ms") - pl.col("measured_ms")) / pl.col("measured_ms")))
    page.figure(plots.measured_vs_predicted(both, "Sandbox ranks: median iteration time", "emulation (sandbox)"))
    emu = data.job_iteration_time(iters)
    if emu and predicted:
        page.figure(plots.iteration_series({"predicted": predicted["gaps_ms"], "emulation": emu["gaps_ms"]},
                                           "The job's iteration times: prediction and emulation"))


__all__ = ["Page", "build"]
