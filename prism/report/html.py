"""The report page: one self-contained HTML file (plotly's JavaScript inlined once, no network at view time)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from prism import job as job_files
from prism.emulate import delays, results
from prism.report import data, header, occupancy, plots
from prism.report.critical import iteration_critical_path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; } td, th { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } table.facts th { color: #555; font-weight: normal; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
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

    def facts(self, rows: list[tuple[str, str]]) -> None:
        cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        self.parts.append(f"<table class='facts'>{cells}</table>")

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


def build(job: str | Path, ranks: list[int] | None = None) -> str:
    """The report of the job at `job` as one HTML page; `data.ReportError` when the calibrated timeline is
    missing (the report needs the prediction). `ranks`: the ranks the per-rank timeline draws (default: all of
    them up to 32 ranks, else the critical path's, rank 0 and the last)."""
    job = Path(job)
    calibrated = data.load_timeline(job, "calibrated")
    iters_path = job_files.calibrated(job, "iterations")
    if not iters_path.is_file():
        raise data.ReportError(f"{iters_path} is missing: run the calibrate stage first (prism calibrate --job {job})")
    iterations = pl.read_parquet(iters_path)
    page = Page(f"prism report: {job.name}")
    predicted = data.job_iteration_time(iterations)
    per_rank = data.per_rank_iteration(iterations)

    baseline = None
    if job_files.graph_file(job_files.baseline(job), "events").is_file():
        baseline = data.load_timeline(job, "baseline")
    base_iters = data.marker_iterations(baseline.events) if baseline else None
    measured = data.job_iteration_time(base_iters) if base_iters is not None and base_iters.height else None

    page.parts.append(f"<h1>{html.escape(page.title)}</h1>")
    page.facts(header.facts(job, calibrated.world) + [
        ("iterations, events", f"{iterations['iteration'].n_unique()} iterations, {calibrated.events.height:,} "
                               "events (predicted timeline)")])
    ranks_path = job_files.graph_file(job, "ranks")
    rank_rows = pl.read_parquet(ranks_path) if ranks_path.is_file() else None
    if rank_rows is not None and "iteration_rule" in rank_rows.columns:
        rules = rank_rows.group_by("iteration_rule", "microbatch_rule", "iterations").len().sort("len")
        page.text("Boundaries: " + "; ".join(
            f"{n} ranks with {it} iterations, by rule '{rule}' (microbatches: '{mb}')"
            for rule, mb, it, n in rules.iter_rows()), "note")
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
    window = data.one_iteration(calibrated.events, iterations, shown)
    classes = occupancy.rank_classes(job, list(range(calibrated.world)))
    if window.height:
        lo, hi = int(window["start_ns"].min()), int(window["end_ns"].max())
        if calibrated.world > occupancy.MAX_RANKS_DRAWN or ranks:
            page.text(f"All {calibrated.world} ranks, by {'pipeline stage' if classes['class'].n_unique() > 1 else 'class'}: "
                      "the share of the ranks' time in compute, communication and waiting over the iteration "
                      "(200 time bins, exact overlaps; prism/report/occupancy.py).")
            page.figure(plots.occupancy(occupancy.occupancy(window, classes, lo, hi),
                                        f"Predicted iteration {shown}, every rank, by class"))
        drawn = occupancy.chosen_ranks(calibrated.world, path, ranks)
        if len(drawn) < calibrated.world:
            page.text(f"Ranks drawn one by one below: {', '.join(map(str, drawn))} (the critical path's ranks, rank 0 "
                      f"and the last, unless chosen: prism report --job {job} --ranks 3,17).", "note")
        page.figure(plots.gantt(window.filter(pl.col("rank").is_in(drawn)), path,
                                f"Predicted timeline of iteration {shown} (black: the critical path)", t0=lo))

    page.heading("Compute, communication, idle: % of the iteration")
    own = job_files.own_durations(job)
    breakdown = data.time_breakdown(calibrated.events, pl.read_parquet(own) if own.is_file() else None)
    if not own.is_file():
        page.text("No slices/durations.parquet: idle time is not separated from communication.", "note")
    shares = data.iteration_shares(breakdown, iterations)
    by_class = data.shares_by_class(shares, classes)
    page.text("Per iteration, not summed over iterations: each rank's compute, communication (its own duration), idle "
              "(the part of a wait beyond its own duration: blocked on another rank) and other time (between events) "
              "as a share of its iteration time, mean over iterations >= 1.")
    wide = calibrated.world > occupancy.MAX_RANKS_DRAWN
    shown_shares = by_class if wide else shares.with_columns(ranks=pl.lit(1))
    key = "class" if wide else "rank"
    page.table(shown_shares.select(
        pl.col(key), "ranks", pl.col("iteration_ms").alias("iteration ms"),
        *[pl.col(f"{k}_pct").alias(f"{k} %") for k in ("compute", "communication", "idle", "other")],
        *[pl.col(f"{k}_ms").alias(f"{k} ms") for k in ("compute", "communication", "idle")]).drop(
        [] if wide else ["ranks"]))
    sums = shares.select(sum(pl.col(f"{k}_pct") for k in ("compute", "communication", "idle", "other")))
    if sums.height and float(sums.to_series().max()) > 100.5:
        page.text("Some ranks' shares add up to more than 100 %: their events overlap (an async op on another stream "
                  "beside compute or a wait), and each event counts its whole duration.", "note")
    page.figure(plots.breakdown(shown_shares, x=key))

    page.heading("Peak memory per rank")
    mem = data.peak_memory(calibrated.events)
    if mem["peak_mib"].null_count() == mem.height:
        page.text("Memory was not measured in this capture.", "note")
    else:
        page.figure(plots.memory(mem))

    if job_files.emulation(job, "iterations.parquet").is_file():
        _emulation_section(page, job)
    if job_files.emulation(job, delays.FILE).is_file():
        _emulation_delays(page, job)
    if job_files.emulation(job, "events.parquet").is_file():
        _emulation_memory(page, job)
    if baseline is None:
        page.heading("Baseline (the real run)")
        decided = header.baseline_decision(job)
        if decided is not None:
            page.text(f"No baseline: {decided['reason']} (decided on {decided.get('host', '?')}, "
                      f"{job / 'baseline-decision.json'}). The prediction above is not compared with a real run.")
        else:
            page.text(f"No baseline: {job_files.graph_file(job_files.baseline(job))} is absent (the config's "
                      "baseline.run is never, or the job was not run by the pipeline). The prediction above is not "
                      "compared with a real run.")
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


def _emulation_section(page: Page, job: Path) -> None:
    """The sandbox's figures, computed by `prism.emulate.results` (the numbers the emulation's summary prints)."""
    page.heading("Emulation: sandbox ranks measured vs predicted")
    fig = results.read_figures(job)
    if not fig.ranks:
        page.text(f"No sandbox rank with iteration times in {job_files.emulation(job)}.", "note")
        return
    page.text(f"Sandbox ranks (ran for real in the emulation): {', '.join(str(r.rank) for r in fig.ranks)}; "
              f"iterations compared: {', '.join(map(str, fig.iterations))}.")
    lines = html.escape("\n".join(results.text_lines(fig)))
    page.parts.append(f"<pre style='white-space: pre-wrap'>{lines}</pre>")
    table = pl.DataFrame(results.rank_table(fig), strict=False)
    page.table(table)
    both = table.select("rank", "predicted_ms", "measured_ms").drop_nulls()
    if both.height:
        page.figure(plots.measured_vs_predicted(both, "Sandbox ranks: median iteration time", "emulation (sandbox)"))
    if fig.predicted_gaps_ms and fig.under_sandbox_gaps_ms:
        page.figure(plots.iteration_series({"predicted": fig.predicted_gaps_ms,
                                            "under the sandbox": fig.under_sandbox_gaps_ms},
                                           "The job's iteration times: prediction and under the sandbox"))


def _emulation_delays(page: Page, job: Path) -> None:
    """The emulation's own delay per op kind, computed by `prism.emulate.delays` (the lines its summary prints)."""
    table = delays.read_delays(job)
    page.heading("Emulation: its own delay per op kind")
    lines = html.escape("\n".join(delays.text_lines(table)))
    page.parts.append(f"<pre style='white-space: pre-wrap'>{lines}</pre>")
    if table.num_rows:
        page.table(pl.from_arrow(table.drop_columns(["iterations"])))


def _emulation_memory(page: Page, job: Path) -> None:
    path = job_files.emulation(job, "memory.parquet")
    memory = pl.read_parquet(path) if path.is_file() else None
    page.heading("Emulation: the sandbox ranks' memory")
    if memory is None or not memory.height or (memory["mem_bytes"] < 0).all():
        page.text(f"No memory was measured in the emulation ({path}).", "note")
        return
    peaks = memory.group_by("rank").agg(peak_mib=pl.col("mem_peak_bytes").max() / 2**20,
                                        last_mib=pl.col("mem_bytes").last() / 2**20).sort("rank")
    page.table(peaks)
    page.figure(plots.emulation_memory(memory.filter(pl.col("mem_bytes") >= 0)))
    page.text("On CPU: the process's resident set size and its peak (prism/runtime/memory.py); on CUDA: the caching "
              "allocator's.", "note")


__all__ = ["Page", "build"]
