"""The report's figures (plotly), each from the tables `prism.report.data` computes."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

KIND_COLORS = {"compute": "#4C78A8", "collective": "#F58518", "send": "#54A24B", "recv": "#72B7B2",
               "wait": "#E45756", "marker": "#9D755D"}
MAX_GANTT_EVENTS = 20000  # a browser draws this many bars without trouble


MAX_RANK_TICKS = 32  # up to this many ranks, one category (tick) a rank; beyond, a numeric rank axis


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 380, ranks: int = 0) -> go.Figure:
    if x == "rank" and ranks > MAX_RANK_TICKS:  # W=1024: a tick per rank would be a black band
        fig.update_xaxes(type="linear", tickformat="d")
    elif x in ("rank", "iteration"):  # whole numbers: one tick each, not 0.5 steps
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
    return _layout(fig, "Iteration time per rank (median over iterations >= 1)", "rank", "ms",
                   ranks=predicted.height)


def breakdown(table: pl.DataFrame, x: str = "rank") -> go.Figure:
    """Stacked bars: compute, communication, idle and the rest as % of the iteration, per rank (or rank class:
    `x`), from `data.iteration_shares`."""
    fig = go.Figure()
    for column, name, color in (("compute_pct", "compute", KIND_COLORS["compute"]),
                                ("communication_pct", "communication", KIND_COLORS["collective"]),
                                ("idle_pct", "idle (blocked on other ranks)", "#BAB0AC"),
                                ("other_pct", "other (between events)", "#E8E8E8")):
        fig.add_bar(x=table[x].to_list(), y=table[column].to_list(), name=name, marker_color=color,
                    customdata=table.select(column.replace("_pct", "_ms")).to_series().to_list(),
                    hovertemplate="%{y:.1f} % (%{customdata:.2f} ms an iteration)<extra>" + name + "</extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(range=[0, 100])
    return _layout(fig, "Compute, communication and idle as % of the iteration (predicted, mean over "
                   "iterations >= 1)", x, "% of the iteration")


def memory(table: pl.DataFrame) -> go.Figure:
    fig = go.Figure(go.Bar(x=table["rank"].to_list(), y=table["peak_mib"].to_list(), name="peak"))
    return _layout(fig, "Peak memory per rank (from the capture)", "rank", "MiB", ranks=table.height)


def gantt(events: pl.DataFrame, path: pl.DataFrame | None, title: str, t0: int | None = None) -> go.Figure:
    """One horizontal bar per event (rank on y, time on x), coloured by kind; the critical path on top (its part
    on the ranks drawn). `t0`: the time the x axis starts from (default the first event's)."""
    ev = events.filter(pl.col("kind") != "marker").sort("start_ns")
    if path is not None:
        path = path.filter(pl.col("rank").is_in(events["rank"].unique().implode()))
    if ev.height > MAX_GANTT_EVENTS:
        ev = ev.sort(pl.col("end_ns") - pl.col("start_ns"), descending=True).head(MAX_GANTT_EVENTS)
        title += f" (the {MAX_GANTT_EVENTS} longest events)"
    t0 = int(events["start_ns"].min()) if t0 is None else t0
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
    return _layout(fig, title, "us from the iteration's start", "", height=max(300, 60 + 28 * events["rank"].n_unique()))


def occupancy(table: pl.DataFrame, title: str) -> go.Figure:
    """One strip per rank class: the share of its ranks' time in compute, communication and waiting over the
    iteration (stacked areas, `prism.report.occupancy`): readable at any W."""
    from plotly.subplots import make_subplots

    names = table["class"].unique(maintain_order=True).to_list()
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.25 / len(names),
                        row_titles=[f"{n} ({table.filter(pl.col('class') == n)['ranks'][0]} ranks)" for n in names])
    for row, name in enumerate(names, start=1):
        part = table.filter(pl.col("class") == name)
        for kind, color in (("compute", KIND_COLORS["compute"]), ("communication", KIND_COLORS["collective"]),
                            ("wait", KIND_COLORS["wait"])):
            fig.add_scatter(x=part["t_us"].to_list(), y=(100 * part[kind]).to_list(), stackgroup=f"s{row}",
                            mode="lines", line=dict(width=0, color=color), name=kind, legendgroup=kind,
                            showlegend=row == 1, row=row, col=1,
                            hovertemplate="%{y:.0f} % of the ranks' time<extra>" + kind + "</extra>")
        fig.update_yaxes(range=[0, 100], tickvals=[0, 50, 100], row=row, col=1, ticksuffix=" %")
    fig.update_annotations(textangle=0, xanchor="left", font_size=11)
    _layout(fig, title, "", "", height=140 + 100 * len(names))
    fig.update_xaxes(title_text="us from the iteration's start", row=len(names), col=1)
    fig.update_layout(margin=dict(l=60, r=150, t=50, b=50))
    return fig


def emulation_memory(table: pl.DataFrame) -> go.Figure:
    """The sandbox ranks' memory at each marker of their real run in the emulation (emulation/memory.parquet)."""
    fig = go.Figure()
    for rank in sorted(table["rank"].unique().to_list()):
        part = table.filter(pl.col("rank") == rank).sort("t_ns")
        fig.add_scatter(x=(part["t_ns"] / 1e6).to_list(), y=(part["mem_bytes"] / 2**20).to_list(),
                        mode="lines", name=f"rank {rank}: memory", customdata=part["marker"].to_list(),
                        hovertemplate="%{customdata}: %{y:.1f} MiB<extra></extra>")
        fig.add_scatter(x=(part["t_ns"] / 1e6).to_list(), y=(part["mem_peak_bytes"] / 2**20).to_list(),
                        mode="lines", line=dict(dash="dot"), name=f"rank {rank}: peak")
    return _layout(fig, "Sandbox ranks' memory during the emulation (at each marker)", "ms from the emulation's start",
                   "MiB")


def measured_vs_predicted(table: pl.DataFrame, title: str, measured_name: str) -> go.Figure:
    """Paired bars per rank: `table` has rank, predicted_ms, measured_ms."""
    fig = go.Figure()
    fig.add_bar(x=table["rank"].to_list(), y=table["predicted_ms"].to_list(), name="predicted")
    fig.add_bar(x=table["rank"].to_list(), y=table["measured_ms"].to_list(), name=measured_name)
    fig.update_layout(barmode="group")
    return _layout(fig, title, "rank", "ms", ranks=table.height)


def iteration_series(series: dict[str, list[float]], title: str) -> go.Figure:
    """One line per timeline: the job's iteration times, iterations 1..n."""
    fig = go.Figure()
    for name, values in series.items():
        fig.add_scatter(x=list(range(1, len(values) + 1)), y=values, mode="lines+markers", name=name)
    return _layout(fig, title, "iteration", "ms")


__all__ = ["breakdown", "emulation_memory", "gantt", "iteration_series", "iteration_time_per_rank",
           "measured_vs_predicted", "memory", "occupancy"]
