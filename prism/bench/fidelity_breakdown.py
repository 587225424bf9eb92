"""Where a prediction misses the truth: per event kind, per slice pass, from a saved bench run.

    python -m prism.bench.fidelity_breakdown CONFIG_DIR [CONFIG_DIR ...] [--ops ITERATION]

A CONFIG_DIR is what `prism bench fidelity --work W` keeps per config (`W/<config>`, or the device runs'
`artifacts.tar.xz` unpacked): `truth0/graph/` (the first truth run's graph), `prism0/graph/` (the capture
graph), `prism0/slices[_timed]/slice=K/events.parquet` and `transfers.parquet`, and the calibrations
`prism0/calibrated_untimed/` and `prism0/calibrated/`. Per directory it prints one line per source:

- **ms per rank-iteration by kind** (iterations >= 1): the sum of event durations of each kind divided by
  the number of ranks and iterations; the truth's and the slice runs' are wall spans (end - start), the
  calibrations' are the timeline's spans (what the sweep put there);
- **compute CPU**: the compute events' own ``device_ns`` (on CPU the thread's CPU time, what calibration
  takes as a compute duration) per rank-iteration, beside the wall span;
- **sweep of truth0's own measurements**: the calibration sweep run on the truth's graph with the truth's
  own durations and transfers, its iteration time beside the truth's (`prism.iterations`): what the model
  gives when its inputs are right; by the method's rule (`durations.measured_run`, what the slice runs'
  measurements go through: `prism.bench.fidelity_model`) and, after it, by the bare rule used before
  session 9 (compute its CPU time, a comm's transfer the mean member delay of the slice rule);
- **transfer**: the sum over the comms of iterations >= 1 of their transfer, per iteration: the truth's by
  the slice rule (`from_slices.slice_delays` over all its ranks: every member's delay from the last issue
  to when it saw completion, averaged), the slice passes' from their ``transfers.parquet``.

With ``--ops K``: rank 0's collectives of iteration K one per line (op, bytes, async, issue time from the
rank's first event of K in the truth), each comm's transfer in the truth, the untimed and the timed pass.

With ``--ranks``: one markdown table per directory, a row per rank and source (every truth run ``truthN/graph``,
each slice pass): ms per iteration (iterations >= 1) of the rank's compute CPU time (``device_ns``), compute wall
span, waits and collective issue spans, and the rank's compute CPU over truth0's on the same events (rank, seq):
whether a slice pass's compute speed is one rank's, one slice's or the whole run's.

Nothing here feeds a prediction; it is the data behind the diagnosis in docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prism import job as job_files

KINDS = ("compute", "collective", "send", "recv", "wait", "marker")


def per_kind_ms(kind, rank, iteration, duration_ns) -> dict[str, float]:
    """ms per rank-iteration of each kind, over iterations >= 1 (ranks and iterations present in them)."""
    kind, rank = np.asarray(kind), np.asarray(rank)
    iteration, duration_ns = np.asarray(iteration), np.asarray(duration_ns, dtype=np.int64)
    sel = iteration >= 1
    if not sel.any():
        return {}
    n = len(np.unique(rank[sel])) * len(np.unique(iteration[sel]))
    return {k: float(duration_ns[sel & (kind == k)].sum()) / 1e6 / n for k in KINDS if (sel & (kind == k)).any()}


def _events(paths: list[Path]) -> pa.Table:
    cols = ["event_id", "rank", "kind", "iteration", "t_start_ns", "t_end_ns", "device_ns", "comm_id"]
    return pa.concat_tables([pq.read_table(p, columns=cols) for p in paths])


def _fmt(label: str, d: dict[str, float], extra: str = "") -> str:
    parts = " ".join(f"{k} {d[k]:7.2f}" for k in KINDS if k in d)
    return f"  {label:22s} {parts}  sum {sum(d.values()):7.2f}{extra}"


def _compute_cpu(t: pa.Table) -> str:
    kind, it = t["kind"].to_numpy(zero_copy_only=False), t["iteration"].to_numpy()
    sel = (kind == "compute") & (it >= 1)
    n = len(np.unique(t["rank"].to_numpy()[sel])) * len(np.unique(it[sel]))
    cpu = t["device_ns"].to_numpy()[sel].sum() / 1e6 / n
    wall = (t["t_end_ns"].to_numpy() - t["t_start_ns"].to_numpy())[sel].sum() / 1e6 / n
    return f"  compute CPU {cpu:7.2f} (wall/CPU {wall / cpu:.3f})"


def _comm_iterations(events: pa.Table) -> dict[int, int]:
    comm, it = events["comm_id"].to_numpy(), events["iteration"].to_numpy()
    return {int(c): int(i) for c, i in zip(comm, it) if c >= 0}


def breakdown(config_dir: Path) -> list[str]:
    from prism.calibrate.from_slices import slice_delays
    from prism.calibrate.stage import load_graph

    job = config_dir / "prism0"
    lines = [str(config_dir)]
    cap = pq.read_table(job_files.graph_file(job), columns=["event_id", "kind", "iteration", "rank"])
    truth = _events([job_files.graph_file(config_dir / "truth0")])
    span = pa.compute.subtract(truth["t_end_ns"], truth["t_start_ns"])
    lines.append(_fmt("truth0 (wall)", per_kind_ms(truth["kind"].to_numpy(zero_copy_only=False), truth["rank"],
                                                   truth["iteration"], span)) + _compute_cpu(truth))
    by_id = {int(e): i for i, e in enumerate(cap["event_id"].to_numpy())}
    kinds = cap["kind"].to_numpy(zero_copy_only=False)
    for name in (job_files.UNTIMED_CALIBRATION, job_files.CALIBRATED):
        path = job_files.calibrated(job, folder=name)
        if not path.is_file():
            continue
        tl = pq.read_table(path, columns=["event_id", "rank", "start_ns", "end_ns"])
        rows = np.array([by_id[int(e)] for e in tl["event_id"].to_numpy()], dtype=np.int64)
        dur = tl["end_ns"].to_numpy() - tl["start_ns"].to_numpy()
        lines.append(_fmt(name, per_kind_ms(kinds[rows], tl["rank"], cap["iteration"].to_numpy()[rows], dur)))
    comm_it = _comm_iterations(_events([job_files.graph_file(job)]))
    n_it = len({i for i in comm_it.values() if i >= 1}) or 1
    tj = load_graph(config_dir / "truth0")
    c = tj.columns
    total, count = slice_delays(tj.graph.kind, tj.graph.comm, tj.graph.wait_op, c["t_start_ns"], c["t_end_ns"],
                                c["t_complete_ns"], np.arange(len(tj.event_ids)), tj.graph.n_comms)
    mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    use = np.array([comm_it.get(int(cid), -1) >= 1 for cid in tj.comm_ids])
    lines.append(f"  {'transfer, truth0':22s} {mean[use].sum() / 1e6 / n_it:8.2f} ms per iteration")
    lines.append(self_sweep(config_dir / "truth0"))
    for folder in (job_files.SLICES, job_files.TIMED_SLICES):
        paths = job_files.slice_files(job, folder=folder)
        if not paths:
            continue
        t = _events(paths)
        span = pa.compute.subtract(t["t_end_ns"], t["t_start_ns"])
        lines.append(_fmt(f"{folder} (wall)", per_kind_ms(t["kind"].to_numpy(zero_copy_only=False), t["rank"],
                                                          t["iteration"], span)) + _compute_cpu(t))
        tr_path = job_files.slice_transfers(job, folder)
        if tr_path.is_file():
            tr = pq.read_table(tr_path)
            ids, x = tr["comm_id"].to_numpy(), tr["transfer_ns"].to_numpy()
            keep = np.array([comm_it.get(int(cid), -1) >= 1 for cid in ids])
            lines.append(f"  {'transfer, ' + folder:22s} {x[keep].sum() / 1e6 / n_it:8.2f} ms per iteration")
    return lines


def self_sweep(truth: Path) -> str:
    """The sweep on the truth's graph with its own inputs (`fidelity_model.self_sweep`): by the method's rule
    (`measured_run`, the clock rule of the slice runs) and by the pre-session-9 bare rule, beside the truth's own."""
    from prism.bench.fidelity_model import self_sweep as sweep

    own, measured = sweep(truth, "measured")
    _, bare = sweep(truth, "bare")
    pct = lambda v: f"{100 * (v - own) / own:+.1f} %"  # noqa: E731
    return (f"  {'sweep of truth0':22s} {measured:8.2f} ms per iteration (truth0 itself {own:.2f} ms, "
            f"{pct(measured)}; the bare rule: {bare:.2f} ms, {pct(bare)})")


def rank_row(kind, iteration, start_ns, end_ns, cpu_ns) -> dict[str, float]:
    """One rank's ms per iteration (iterations >= 1): compute CPU and wall, waits and collective issue spans."""
    kind, iteration = np.asarray(kind), np.asarray(iteration)
    span = np.asarray(end_ns, dtype=np.int64) - np.asarray(start_ns, dtype=np.int64)
    sel = iteration >= 1
    n = max(1, len(np.unique(iteration[sel])))
    compute = sel & (kind == "compute")
    return {"compute CPU": float(np.asarray(cpu_ns, dtype=np.int64)[compute].sum()) / 1e6 / n,
            "compute wall": float(span[compute].sum()) / 1e6 / n,
            "wait": float(span[sel & (kind == "wait")].sum()) / 1e6 / n,
            "collective": float(span[sel & (kind == "collective")].sum()) / 1e6 / n}


def cpu_ratio(base: dict[int, int], other: dict[int, int]) -> float:
    """Compute CPU of `other` over `base` on the events (seq -> CPU ns) both have; nan if none."""
    common = [k for k in other if k in base]
    den = sum(base[k] for k in common)
    return sum(other[k] for k in common) / den if den > 0 else float("nan")


def sources(config_dir: Path) -> tuple[dict[str, dict[int, tuple[dict, dict]]], dict[str, float]]:
    """Every truth run's graph and every prism run's slice passes (prism0's named by the pass alone, the others
    `prismN PASS`): per source and rank the `rank_row` figures and the compute events' CPU (seq -> ns, iterations
    >= 1); and when each source began (its first event, host monotonic s: the streams of one device call share
    that clock, so a speed that moves with the time is the host's)."""
    cols = ["rank", "seq", "kind", "iteration", "t_start_ns", "t_end_ns", "device_ns"]
    found = [(d.name, [job_files.graph_file(d)]) for d in sorted(config_dir.glob("truth*"), key=_run_number)
             if job_files.graph_file(d).is_file()]
    for job in sorted(config_dir.glob("prism*"), key=_run_number):
        found += [(f if job.name == "prism0" else f"{job.name} {f}", p) for f in (job_files.SLICES, job_files.TIMED_SLICES)
                  if (p := job_files.slice_files(job, folder=f))]
    per: dict[str, dict[int, tuple[dict, dict]]] = {}
    began: dict[str, float] = {}
    for name, paths in found:
        t = pa.concat_tables([pq.read_table(p, columns=cols) for p in paths])
        kind, rank = t["kind"].to_numpy(zero_copy_only=False), t["rank"].to_numpy()
        it, seq = t["iteration"].to_numpy(), t["seq"].to_numpy()
        start, end, cpu = t["t_start_ns"].to_numpy(), t["t_end_ns"].to_numpy(), t["device_ns"].to_numpy()
        began[name] = float(start.min()) / 1e9
        per[name] = {}
        for r in np.unique(rank):
            m = rank == r
            c = m & (kind == "compute") & (it >= 1)
            per[name][int(r)] = (rank_row(kind[m], it[m], start[m], end[m], cpu[m]),
                                 dict(zip(seq[c].tolist(), cpu[c].tolist())))
    return per, began


def _run_number(d: Path) -> int:
    digits = d.name.lstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits) if digits.isdigit() else -1


def whole_cpu_ratio(base: dict[int, tuple[dict, dict]], by_rank: dict[int, tuple[dict, dict]]) -> float:
    """Compute CPU of a source over `base`'s (a truth run's) on the events of every rank both have."""
    both = [(base[r][1], cpu) for r, (_, cpu) in by_rank.items() if r in base]
    return cpu_ratio({(i, k): v for i, (b, _) in enumerate(both) for k, v in b.items()},
                     {(i, k): v for i, (_, o) in enumerate(both) for k, v in o.items()})


def ranks(config_dir: Path) -> list[str]:
    """Per rank and source (`sources`): the `rank_row` figures and the compute CPU vs truth0; a row 'all' per
    source (the mean over its ranks) and when the source began."""
    per, began = sources(config_dir)
    lines = [str(config_dir), "| rank | source | began s | compute CPU | compute wall | wait | collective | "
             "CPU vs truth0 |", "|---|---|---|---|---|---|---|---|"]
    base = per.get("truth0", {})

    def row(r, name: str, figures: dict, ratio: float) -> str:
        return (f"| {r} | {name} | {began[name]:.1f} | " + " | ".join(f"{v:.2f}" for v in figures.values())
                + f" | {ratio:.3f} |")

    for r in sorted({r for p in per.values() for r in p}):
        for name in per:
            if r in per[name]:
                figures, cpu = per[name][r]
                lines.append(row(r, name, figures, cpu_ratio(base[r][1], cpu) if r in base else float("nan")))
    for name, by_rank in per.items():
        mean = {k: float(np.mean([f[k] for f, _ in by_rank.values()])) for k in next(iter(by_rank.values()))[0]}
        lines.append(row("all", name, mean, whole_cpu_ratio(base, by_rank)))
    return lines


def ops(config_dir: Path, iteration: int) -> list[str]:
    """Rank 0's collectives of `iteration`: the truth's transfer (slice rule over all ranks) and each pass's."""
    from prism.calibrate.from_slices import slice_delays
    from prism.calibrate.stage import load_graph

    tj = load_graph(config_dir / "truth0")
    c = tj.columns
    total, count = slice_delays(tj.graph.kind, tj.graph.comm, tj.graph.wait_op, c["t_start_ns"], c["t_end_ns"],
                                c["t_complete_ns"], np.arange(len(tj.event_ids)), tj.graph.n_comms)
    truth = {int(cid): (total[i] / count[i] if count[i] else float("nan")) for i, cid in enumerate(tj.comm_ids)}
    passes = {}
    for folder in (job_files.SLICES, job_files.TIMED_SLICES):
        path = job_files.slice_transfers(config_dir / "prism0", folder)
        if path.is_file():
            t = pq.read_table(path)
            passes[folder] = dict(zip(t["comm_id"].to_pylist(), t["transfer_ns"].to_pylist()))
    ev = pq.read_table(job_files.graph_file(config_dir / "truth0"),
                       columns=["rank", "seq", "kind", "op", "bytes", "is_async", "iteration", "t_start_ns", "comm_id"])
    ev = ev.filter(pa.compute.and_(pa.compute.equal(ev["rank"], 0), pa.compute.equal(ev["iteration"], iteration)))
    first = pa.compute.min(ev["t_start_ns"]).as_py()
    ev = ev.filter(pa.compute.equal(ev["kind"], "collective")).sort_by("seq")
    head = f"  rank 0, iteration {iteration}: op, bytes, async, issue ms, transfer ms: truth0 " + " ".join(passes)
    lines = [str(config_dir), head]
    for r in ev.to_pylist():
        cid = r["comm_id"]
        cols = " ".join(f"{passes[f].get(cid, float('nan')) / 1e6:8.2f}" for f in passes)
        lines.append(f"  {r['op']:14s} {r['bytes']:9d} {str(r['is_async']):5s} {(r['t_start_ns'] - first) / 1e6:8.2f} "
                     f"{truth.get(cid, float('nan')) / 1e6:8.2f} {cols}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_breakdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="CONFIG_DIR")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--ops", type=int, metavar="ITERATION", help="rank 0's collectives of this iteration")
    view.add_argument("--ranks", action="store_true", help="per rank and source: compute CPU and wall, waits")
    args = parser.parse_args(argv)
    status = 0
    for d in args.dirs:
        if not job_files.graph_file(d / "truth0").is_file() or not job_files.graph_dir(d / "prism0").is_dir():
            print(f"prism fidelity_breakdown: error: {d} holds no truth0/graph and prism0/graph (a config folder "
                  "of `prism bench fidelity --work DIR`)", file=sys.stderr)
            status = 2
            continue
        lines = ops(d, args.ops) if args.ops is not None else ranks(d) if args.ranks else breakdown(d)
        print("\n".join(lines), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
