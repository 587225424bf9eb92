"""What the fidelity bench measures of a run: iteration times, calibrations, per-event errors (`prism.bench.fidelity`).

Split from `prism/bench/fidelity.py` (running the bench) by role: these functions read a finished run's tables
and compute the figures its JSON records; the definitions are in that module's docstring.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from prism import job as job_files
from prism.iterations import iteration_times, job_iteration_ends


class StepError(Exception):
    """A step of the bench failed or its output is unusable (the message says which and why)."""

def _median_gap_ms(iteration, end_ns) -> float:
    """The job's iteration time (ms) by the one definition, `prism.iterations`."""
    times = iteration_times(iteration, end_ns)
    if times is None:
        raise StepError(f"only {len(job_iteration_ends(iteration, end_ns))} iteration end(s): use more --steps")
    return times.median_ms


def _strings(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_dictionary(col.type):
        col = col.cast(pa.string())
    return np.asarray(col.to_pylist(), dtype=object)


def truth_ends(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(iteration, end_ns) of every rank's ``iteration_end`` marker of a real run, from its raw per-rank
    streams (no graph needed)."""
    return truth_rank_ends(run_dir)[1:]


def truth_rank_ends(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, iteration, end_ns) of every ``iteration_end`` marker of a real run, from its raw streams."""
    from prism import artifacts, schemas

    ranks, its, ends = [], [], []
    for path in job_files.rank_streams(run_dir):
        t = artifacts.read_raw_stream(path, schemas.RAW_EVENTS)
        sel = (_strings(t.column("kind")) == "marker") & (_strings(t.column("op")) == "iteration_end")
        ranks.append(t.column("rank").to_numpy()[sel])
        its.append(t.column("iteration").to_numpy()[sel])
        ends.append(t.column("t_end_ns").to_numpy()[sel])
    if not its:
        raise StepError(f"{job_files.raw_dir(run_dir)}: no rank streams")
    return np.concatenate(ranks), np.concatenate(its), np.concatenate(ends)


def calibrated(job: Path, slices: bool,
               folder: str = job_files.SLICES) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray]]:
    """(timeline, (iteration, end_ns) per rank and iteration) of the job's graph calibrated with slice
    (JOB/<folder>: untimed `slices` or `slices_timed`) or bare-graph durations."""
    from prism.calibrate.stage import calibrate

    durations = transfers = None
    if slices:
        durations, transfers = durations_from_slices(job, folder)
    tables, _, _ = calibrate(job, durations, transfers)
    it = tables["iterations"]
    return tables["timeline"], (it.column("iteration").to_numpy(), it.column("end_ns").to_numpy())


def durations_from_slices(job: Path, folder: str = job_files.SLICES) -> tuple[Path, Path]:
    """JOB/<folder>/{durations,transfers}.parquet from its slice runs (`prism.calibrate.from_slices`)."""
    from prism.calibrate.from_slices import from_slices

    durations, transfers = from_slices(job, folder)
    d, t = job_files.own_durations(job, folder), job_files.slice_transfers(job, folder)
    pq.write_table(durations, d)
    pq.write_table(transfers, t)
    return d, t


def event_errors(truth_run: Path, job: Path, timeline: pa.Table, truth_ends_: np.ndarray,
                 pred_ends: np.ndarray) -> dict:
    """Per-event |start error| and |duration error| (ms; median, p95) after the job's iteration 0, from the
    graphs of `truth_run` (a real run's folder) and `job` (the captured job's).

    Starts are compared in two ways: from the job's end of the event's previous iteration (``start_*``:
    where in its iteration the event starts) and from the job's end of iteration 0 (``cum_start_*``:
    accumulates every earlier iteration's error and the truth run's own iteration-to-iteration noise).

    Events are matched by (rank, seq); the capture graph and the real graph must list the same events
    (same kind and op at every (rank, seq)) -- `aligned` says whether they do (mismatches are counted and
    left out)."""
    cols = ["rank", "seq", "kind", "op", "iteration", "t_start_ns", "t_end_ns"]
    t0_truth, t0_pred = int(truth_ends_[0]), int(pred_ends[0])
    real = pq.read_table(job_files.graph_file(truth_run), columns=cols).sort_by([("rank", "ascending"),
                                                                                 ("seq", "ascending")])
    cap = pq.read_table(job_files.graph_file(job), columns=["rank", "seq", "kind", "op"]).sort_by(
        [("rank", "ascending"), ("seq", "ascending")])
    tl = timeline.sort_by([("rank", "ascending"), ("seq", "ascending")])
    n_real, n_cap = real.num_rows, cap.num_rows
    key = lambda t: list(zip(t.column("rank").to_pylist(), t.column("seq").to_pylist()))  # noqa: E731
    same_keys = n_real == n_cap and key(real) == key(cap)
    if not same_keys:
        # match on the common (rank, seq) only
        rk = {k: i for i, k in enumerate(key(real))}
        pairs = [(rk[k], j) for j, k in enumerate(key(cap)) if k in rk]
        ri = np.array([a for a, _ in pairs], dtype=np.int64)
        ci = np.array([b for _, b in pairs], dtype=np.int64)
    else:
        ri = ci = np.arange(n_real)
    same = (_strings(real.column("kind"))[ri] == _strings(cap.column("kind"))[ci]) & (
        _strings(real.column("op"))[ri] == _strings(cap.column("op"))[ci])
    ri, ci = ri[same], ci[same]
    ts = real.column("t_start_ns").to_numpy()[ri] - t0_truth
    te = real.column("t_end_ns").to_numpy()[ri] - t0_truth
    ps = tl.column("start_ns").to_numpy()[ci] - t0_pred
    pe = tl.column("end_ns").to_numpy()[ci] - t0_pred
    it = real.column("iteration").to_numpy()[ri]
    after = (ts >= 0) & (it >= 1) & (it < min(len(truth_ends_), len(pred_ends)))
    k = np.clip(it - 1, 0, None)
    k_t = np.clip(k, 0, len(truth_ends_) - 1)
    k_p = np.clip(k, 0, len(pred_ends) - 1)
    ws = np.abs((ps + t0_pred - pred_ends[k_p]) - (ts + t0_truth - truth_ends_[k_t]))[after] / 1e6
    cs = np.abs(ps - ts)[after] / 1e6
    dd = np.abs((pe - ps) - (te - ts))[after] / 1e6
    ds = ws
    return {
        "aligned": bool(same_keys and same.all()),
        "n_real": int(n_real), "n_capture": int(n_cap), "mismatched": int(len(same) - int(same.sum())),
        "n_compared": int(after.sum()),
        "start_med_ms": float(np.median(ds)) if len(ds) else float("nan"),
        "start_p95_ms": float(np.percentile(ds, 95)) if len(ds) else float("nan"),
        "cum_start_med_ms": float(np.median(cs)) if len(cs) else float("nan"),
        "cum_start_p95_ms": float(np.percentile(cs, 95)) if len(cs) else float("nan"),
        "dur_med_ms": float(np.median(dd)) if len(dd) else float("nan"),
        "dur_p95_ms": float(np.percentile(dd, 95)) if len(dd) else float("nan"),
    }
