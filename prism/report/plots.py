"""The report's figures (plotly), each from the tables `prism.report.data` computes."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

KIND_COLORS = {"compute": "#4C78A8", "collective": "#F58518", "send": "#54A24B", "recv": "#72B7B2",
               "wait": "#E45756", "marker": "#9D755D"}
MAX_GANTT_EVENTS = 20000  # a browser draws this many bars without trouble


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 380) -> go.Figure:
    if x in ("rank", "iteration"):  # whole numbers: one tick each, not 0.5 steps
        fig.update_xaxes(type="category" if x == "rank" else "linear", dtick=1)
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=height, template="plotly_white",
                      margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def iteration_time_per_rank(predicted: pl.DataFrame, overall_ms: float | None,
                            measured: pl.DataFrame | None = None, measured_name: str = "baseline") -> go.Figure:
    """Bars: each rank's median predicted iteration time (and measured beside it); a line: the job's."""
    fig = go.Figure()
    fig.add_bar(x=predicted["rank"].to_list(), y=predicted["median_ms"].to_list(), name="predicted")
    if measured is not None and measured.height:
        fig.add_bar(x=measured["rank"].to_list(), y=measured["median_ms"].to_list(), name=measured_name)
    if overall_ms is not None:
        fig.add_hline(y=overall_ms, line_dash="dash", annotation_text=f"job: {overall_ms:.2f} ms")
    fig.update_layout(barmode="group")
    return _layout(fig, "Iteration time per rank (median over iterations >= 1)", "rank", "ms")


def breakdown(table: pl.DataFrame) -> go.Figure:
    """Stacked bars: compute, communication, idle per rank."""
    fig = go.Figure()
    for column, name, color in (("compute_ms", "compute", KIND_COLORS["compute"]),
                                ("communication_ms", "communication", KIND_COLORS["collective"]),
                                ("idle_ms", "idle (blocked on other ranks)", "#BAB0AC")):
        fig.add_bar(x=table["rank"].to_list(), y=table[column].to_list(), name=name, marker_color=color)
    fig.update_layout(barmode="stack")
    return _layout(fig, "Compute, communication and idle per rank (predicted, iterations >= 1, summed)",
                   "rank", "ms")


def memory(table: pl.DataFrame) -> go.Figure:
    fig = go.Figure(go.Bar(x=table["rank"].to_list(), y=table["peak_mib"].to_list(), name="peak"))
    return _layout(fig, "Peak memory per rank (from the capture)", "rank", "MiB")


def gantt(events: pl.DataFrame, path: pl.DataFrame | None, title: str) -> go.Figure:
    """One horizontal bar per event (rank on y, time on x), coloured by kind; the critical path on top."""
    ev = events.filter(pl.col("kind") != "marker").sort("start_ns")
    if ev.height > MAX_GANTT_EVENTS:
        ev = ev.sort(pl.col("end_ns") - pl.col("start_ns"), descending=True).head(MAX_GANTT_EVENTS)
        title += f" (the {MAX_GANTT_EVENTS} longest events)"
    t0 = int(events["start_ns"].min())
    fig = go.Figure()
    for kind, color in KIND_COLORS.items():
        part = ev.filter(pl.col("kind") == kind)
        if not part.height:
            continue
        fig.add_bar(
            orientation="h", name=kind, marker_color=color,
            y=[f"rank {r}" for r in part["rank"].to_list()],
            base=((part["start_ns"] - t0) / 1e3).to_list(),
            x=((part["end_ns"] - part["start_ns"]).clip(lower_bound=1) / 1e3).to_list(),
            customdata=part.select("op", "seq").rows(),
            hovertemplate="%{customdata[0]} (seq %{customdata[1]})<br>%{base:.1f} us + %{x:.1f} us<extra></extra>",
        )
    if path is not None and path.height:
        xs, ys = [], []
        for row in path.iter_rows(named=True):
            xs += [(row["start_ns"] - t0) / 1e3, (row["end_ns"] - t0) / 1e3]
            ys += [f"rank {row['rank']}"] * 2
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name="critical path",
                        line=dict(color="black", width=2), marker=dict(size=4))
    fig.update_layout(barmode="overlay", bargap=0.3)
    ranks = sorted(events["rank"].unique().to_list())  # rank 0 on top, in rank order (not first-drawn order)
    fig.update_yaxes(autorange="reversed", type="category", categoryorder="array",
                     categoryarray=[f"rank {r}" for r in ranks])
    return _layout(fig, title, "us from the iteration's start", "", height=max(300, 60 + 40 * events["rank"].n_unique()))


def measured_vs_predicted(table: pl.DataFrame, title: str, measured_name: str) -> go.Figure:
    """Paired bars per rank: `table` has rank, predicted_ms, measured_ms."""
    fig = go.Figure()
    fig.add_bar(x=table["rank"].to_list(), y=table["predicted_ms"].to_list(), name="predicted")
    fig.add_bar(x=table["rank"].to_list(), y=table["measured_ms"].to_list(), name=measured_name)
    fig.update_layout(barmode="group")
    return _layout(fig, title, "rank", "ms")


def iteration_series(series: dict[str, list[float]], title: str) -> go.Figure:
    """One line per timeline: the job's iteration times, iterations 1..n."""
    fig = go.Figure()
    for name, values in series.items():
        fig.add_scatter(x=list(range(1, len(values) + 1)), y=values, mode="lines+markers", name=name)
    return _layout(fig, title, "iteration", "ms")


__all__ = ["breakdown", "gantt", "iteration_series", "iteration_time_per_rank", "measured_vs_predicted", "memory"]
