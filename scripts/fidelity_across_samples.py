"""Per comm across slices: the slice runs' first-member delays side by side, against the truths' (docs/fidelity.md,
session 17).

    .venv/bin/python scripts/fidelity_across_samples.py CONFIG_DIR [CONFIG_DIR ...]

For each kind of collective across slice runs (`fidelity_across.kinds_of_comms`; iterations >= 1): per truth run
(truth0..4) the comm's transfer (the first member's delay, the measured-run rule) and its members' lag behind the
first (ms, median and mean over the comms); per slice run (untimed pass) its first member's delay; then, over the
comms, the mean of the runs' firsts (session 17's rule), the smallest (session 16's) and what session 16's rule
made the slowest member wait (the largest first: the smallest plus the lag it gave that member), and the
correlation of two runs' samples (independent samples: about 0). Analysis only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from prism import job as job_files
from prism.bench import fidelity_terms as ft
from prism.calibrate.from_slices import member_delays, slice_delays

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_across import kinds_of_comms  # noqa: E402

NONE = np.iinfo(np.int64).max


def report(config_dir: Path) -> list[str]:
    from prism.calibrate.stage import load_graph

    truth = load_graph(config_dir / "truth0")
    cap = load_graph(config_dir / "prism0")
    cmap = ft._aligned(truth, cap, str(config_dir))
    slice_of = ft.slice_of_events(config_dir, truth)
    across = ft.comm_classes(truth, slice_of)["collectives across slices"]
    kind_of, labels = kinds_of_comms(config_dir, truth, slice_of)
    g = truth.graph
    it_comm = np.full(g.n_comms, -1, dtype=np.int64)
    ops = np.flatnonzero(g.comm >= 0)
    it_comm[g.comm[ops]] = truth.iteration[ops]
    truths = []  # per truth run: (transfer, lag sum over members) in truth0's comm order
    for d in sorted(config_dir.glob("truth*")):
        if not job_files.graph_file(d).is_file():
            continue
        t = load_graph(d)
        tm = ft._aligned(truth, t, str(d))
        c = t.columns
        rows = np.arange(len(t.event_ids))
        first = member_delays(t.graph.kind, t.graph.comm, t.graph.wait_op, c["t_start_ns"], c["t_end_ns"],
                              c["t_complete_ns"], rows, t.graph.n_comms)
        total, count = slice_delays(t.graph.kind, t.graph.comm, t.graph.wait_op, c["t_start_ns"], c["t_end_ns"],
                                    c["t_complete_ns"], rows, t.graph.n_comms)
        truths.append((d.name, first[tm], (total - count * np.where(first == NONE, 0, first))[tm]))
    firsts = []
    for name, run in ft._slice_runs(config_dir, job_files.SLICES, cap):
        rows = np.flatnonzero(run["t_end_ns"] >= 0)
        f = member_delays(cap.graph.kind, cap.graph.comm, cap.graph.wait_op, run["t_start_ns"], run["t_end_ns"],
                          run["t_complete_ns"], rows, cap.graph.n_comms)
        firsts.append((name, f[cmap]))
    lines = [f"{config_dir}  (collectives across slices; ms over the comms of iterations >= 1: median / mean)"]
    for k, label in enumerate(labels):
        sel = across & (kind_of == k) & (it_comm >= 1)
        f = np.stack([x for _, x in firsts])[:, sel]
        both = (f != NONE).all(axis=0)
        if not both.any():
            continue
        f = f[:, both].astype(np.float64) / 1e6
        lines.append(f"  {label}  ({both.sum()} comms)")
        for name, x, lag in truths:
            xs, ls = x[sel][both] / 1e6, lag[sel][both] / 1e6
            lines.append(f"    {name:8s} transfer {np.median(xs):6.3f} / {xs.mean():6.3f}   members' lag behind the "
                         f"first, summed {np.median(ls):6.3f} / {ls.mean():6.3f}")
        for (name, _), x in zip(firsts, f):
            lines.append(f"    {name:8s} first member's delay {np.median(x):6.3f} / {x.mean():6.3f}")
        mean, lo, hi = f.mean(axis=0), f.min(axis=0), f.max(axis=0)
        corr = np.corrcoef(f[0], f[1])[0, 1] if len(f) == 2 else float("nan")
        lines.append(f"    runs' mean (s17) {np.median(mean):6.3f} / {mean.mean():6.3f}   smallest (s16's transfer) "
                     f"{np.median(lo):6.3f} / {lo.mean():6.3f}   largest (s16: the slowest member's wait) "
                     f"{np.median(hi):6.3f} / {hi.mean():6.3f}   correlation of the two runs {corr:+.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="CONFIG_DIR")
    args = parser.parse_args(argv)
    for d in args.dirs:
        if not job_files.graph_dir(d / "truth0").is_dir() or not job_files.slices_dir(d / "prism0").is_dir():
            print(f"fidelity_across_samples: error: {d} holds no truth0/graph and prism0/slices", file=sys.stderr)
            return 2
        print("\n".join(report(d)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
