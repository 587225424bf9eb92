"""How often a sync all-reduce stalls, truth against slices (docs/fidelity.md, session 17).

    .venv/bin/python scripts/fidelity_slow_ops.py CONFIG_DIR [CONFIG_DIR ...] [--slow-ms 2.0]

The delays of the sync all-reduces of tp4dp2's 4-member TP groups are bimodal in the truth and in the slice runs
alike: a ring that runs through (0.5-0.9 ms) or one that stalls (3-10 ms), its members seeing the completion
together either way. Per kind of sync all-reduce (group description and size, members per slice run, across
slices or in one, bytes; iterations >= 1): per source (truth runs, each slice run of the untimed pass) the comms'
first-member delay (the measured-run rule's transfer, on the source's own clock: a slice run's from the last
issue of its own members), the share above --slow-ms, and the median below and above it. Analysis only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from prism import artifacts
from prism import job as job_files
from prism.bench import fidelity_terms as ft
from prism.calibrate.arrays import K_COLLECTIVE
from prism.calibrate.from_slices import member_delays

NONE = np.iinfo(np.int64).max


def _sync_kinds(config_dir: Path, truth, slice_of: np.ndarray) -> tuple[np.ndarray, list[str]]:
    ev = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0"),
                                columns=["rank", "seq", "op", "group_name", "bytes", "is_async"])
    order = np.lexsort((ev["seq"].to_numpy(), ev["rank"].to_numpy()))
    op = np.asarray(ev["op"].to_pylist(), dtype=object)[order]
    group = np.asarray(ev["group_name"].to_pylist(), dtype=object)[order]
    nbytes = ev["bytes"].to_numpy()[order]
    is_async = ev["is_async"].to_numpy(zero_copy_only=False)[order]
    groups = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0", "groups"),
                                    columns=["group_name", "group_desc", "size"]).to_pylist()
    desc = {str(g["group_name"]): f"{g['group_desc']}{g['size']}" for g in groups}
    g = truth.graph
    out = np.full(g.n_comms, -1, dtype=np.int64)
    labels: dict[str, int] = {}
    members: dict[int, list[int]] = {}
    for i in np.flatnonzero((g.comm >= 0) & (g.kind == K_COLLECTIVE)):
        members.setdefault(int(g.comm[i]), []).append(int(i))
    for c, rows in members.items():
        i = rows[0]
        if is_async[i] or op[i] != "all_reduce":
            continue
        per = np.bincount(slice_of[rows] - slice_of[rows].min())
        split = "+".join(str(int(x)) for x in per if x)
        where = "across" if (per > 0).sum() > 1 else "one slice"
        label = f"{desc.get(str(group[i]), group[i])} [{split}] {where} {int(nbytes[i])}B"
        out[c] = labels.setdefault(label, len(labels))
    return out, list(labels)


def report(config_dir: Path, slow_ms: float) -> list[str]:
    from prism.calibrate.stage import load_graph

    truth = load_graph(config_dir / "truth0")
    cap = load_graph(config_dir / "prism0")
    cmap = ft._aligned(truth, cap, str(config_dir))
    slice_of = ft.slice_of_events(config_dir, truth)
    kind_of, labels = _sync_kinds(config_dir, truth, slice_of)
    g = truth.graph
    it_comm = np.full(g.n_comms, -1, dtype=np.int64)
    ops = np.flatnonzero(g.comm >= 0)
    it_comm[g.comm[ops]] = truth.iteration[ops]
    sources = []
    for d in sorted(config_dir.glob("truth*")):
        if job_files.graph_file(d).is_file():
            t = load_graph(d)
            c = t.columns
            f = member_delays(t.graph.kind, t.graph.comm, t.graph.wait_op, c["t_start_ns"], c["t_end_ns"],
                              c["t_complete_ns"], np.arange(len(t.event_ids)), t.graph.n_comms)
            sources.append((d.name, f[ft._aligned(truth, t, str(d))]))
    for name, run in ft._slice_runs(config_dir, job_files.SLICES, cap):
        rows = np.flatnonzero(run["t_end_ns"] >= 0)
        f = member_delays(cap.graph.kind, cap.graph.comm, cap.graph.wait_op, run["t_start_ns"], run["t_end_ns"],
                          run["t_complete_ns"], rows, cap.graph.n_comms)
        sources.append((name, f[cmap]))
    lines = [f"{config_dir}  (sync all-reduces, iterations >= 1; first member's delay, ms; slow: > {slow_ms} ms)"]
    for k, label in enumerate(labels):
        sel = (kind_of == k) & (it_comm >= 1)
        if sel.sum() < 10:
            continue
        parts = []
        for name, f in sources:
            x = f[sel]
            x = x[x != NONE] / 1e6
            if not len(x):
                continue
            slow = x > slow_ms
            lo = f"{np.median(x[~slow]):.2f}" if (~slow).any() else "-"
            hi = f"{np.median(x[slow]):.2f}" if slow.any() else "-"
            parts.append(f"{name} {100 * slow.mean():3.0f}% ({lo} | {hi})")
        lines.append(f"  {label:34s} n {int(sel.sum()):4d}: " + "  ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="CONFIG_DIR")
    parser.add_argument("--slow-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.slow_ms <= 0:
        print("fidelity_slow_ops: error: --slow-ms must be > 0", file=sys.stderr)
        return 2
    for d in args.dirs:
        if not job_files.graph_dir(d / "truth0").is_dir() or not job_files.slices_dir(d / "prism0").is_dir():
            print(f"fidelity_slow_ops: error: {d} holds no truth0/graph and prism0/slices", file=sys.stderr)
            return 2
        print("\n".join(report(d, args.slow_ms)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
