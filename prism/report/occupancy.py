"""What a large job's ranks do over one iteration, aggregated so that it stays readable at W=1024 or W=8192: the
ranks grouped into classes (their pipeline stage when the job has one, else all ranks one class), and for each class
and each of `bins` time bins, the share of the class's rank-time spent in compute, communication (collective, send,
recv) and waiting (wait events), the rest being no event at all. Exact (every event's overlap with every bin,
through cumulative sums), not sampled. The per-rank Gantt is kept for a few chosen ranks (`chosen_ranks`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from prism import job as job_files

KINDS = {"compute": ("compute",), "communication": ("collective", "send", "recv"), "wait": ("wait",)}
MAX_RANKS_DRAWN = 32  # up to this many ranks the report draws every rank's bars


def rank_classes(job: Path, ranks: list[int]) -> pl.DataFrame:
    """rank, class: 'stage S' (pipeline stage) when graph/ranks.parquet gives more than one, else 'all ranks'."""
    path = job_files.graph_file(job, "ranks")
    if path.is_file():
        coords = pl.read_parquet(path, columns=["rank", "pp"])
        if coords["pp"].n_unique() > 1:
            return (pl.DataFrame({"rank": ranks}, schema={"rank": pl.Int32})
                    .join(coords.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
                    .with_columns(**{"class": pl.format("stage {}", pl.col("pp").fill_null(-1))})
                    .select("rank", "class"))
    return pl.DataFrame({"rank": ranks, "class": ["all ranks"] * len(ranks)}, schema={"rank": pl.Int32,
                                                                                      "class": pl.String})


def _busy(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Total time of the intervals [starts, ends) that falls inside each bin between consecutive edges."""
    s, e = np.sort(starts).astype(np.float64), np.sort(ends).astype(np.float64)
    cs, ce = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])
    ns, ne = np.searchsorted(s, edges, side="right"), np.searchsorted(e, edges, side="right")
    covered = (ns * edges - cs[ns]) - (ne * edges - ce[ne])  # time covered before each edge
    return np.diff(covered)


def occupancy(events: pl.DataFrame, classes: pl.DataFrame, lo: int, hi: int, bins: int = 200) -> pl.DataFrame:
    """class, ranks, t_us (bin middle, from lo), compute, communication, wait, none (shares of the class's rank-time
    in the bin, summing to 1) over [lo, hi)."""
    edges = np.linspace(lo, hi, bins + 1)
    width = np.diff(edges)
    ev = (events.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi))
          .join(classes, on="rank", how="left").with_columns(pl.col("class").fill_null("other")))
    rows = []
    for name in sorted(classes["class"].unique().to_list(), key=_class_order):
        n = classes.filter(pl.col("class") == name).height
        part = ev.filter(pl.col("class") == name)
        shares = {}
        for kind, kinds in KINDS.items():
            k = part.filter(pl.col("kind").is_in(kinds))
            starts = k["start_ns"].to_numpy().clip(lo, hi)
            ends = k["end_ns"].to_numpy().clip(lo, hi)
            shares[kind] = _busy(starts, ends, edges) / (width * n) if k.height else np.zeros(bins)
        total = sum(shares.values())
        scale = np.where(total > 1, total, 1.0)  # overlapping events of a rank (async ops): never above 1
        rows.append(pl.DataFrame({
            "class": [name] * bins, "ranks": [n] * bins, "t_us": (edges[:-1] + width / 2 - lo) / 1e3,
            **{kind: shares[kind] / scale for kind in KINDS}, "none": 1 - np.minimum(total, 1.0)}))
    return pl.concat(rows) if rows else pl.DataFrame()


def _class_order(name: str):
    head, _, tail = name.partition(" ")
    return (head, int(tail)) if tail.lstrip("-").isdigit() else (head, 0)


def chosen_ranks(world: int, path: pl.DataFrame | None, asked: list[int] | None = None,
                 limit: int = 8) -> list[int]:
    """The ranks whose bars the drill-down Gantt draws: `asked` when given (`prism report --ranks`), every rank when
    the job has at most MAX_RANKS_DRAWN, else the ranks on the critical path (first `limit`), rank 0 and the last."""
    if asked:
        return sorted({r for r in asked if 0 <= r < world})
    if world <= MAX_RANKS_DRAWN:
        return list(range(world))
    on_path = path["rank"].unique(maintain_order=True).to_list()[:limit] if path is not None and path.height else []
    return sorted({0, world - 1, *on_path})


__all__ = ["MAX_RANKS_DRAWN", "chosen_ranks", "occupancy", "rank_classes"]
