"""The "collectives across slices" term, op by op: which comms carry it, transfer or lag, and how much.

    .venv/bin/python scripts/fidelity_across.py CONFIG_DIR [CONFIG_DIR ...] [--pass slices]

CONFIG_DIR: a config folder of `prism bench fidelity --work DIR` (or a device call's artifacts unpacked):
`truth0/graph/`, `prism0/graph/`, `prism0/<pass>/{durations,transfers}.parquet` and `slice=K/events.parquet`.

The collectives whose members ran in different slice runs (`fidelity_terms.comm_classes`) are split by their
kind: the group (its description and size, how many of its members ran in each slice), the op, async or not, the
bytes. Per kind, per iteration (iterations >= 1), the sum of the comms' transfer in truth0 (the measured-run rule:
the first member's delay) and in the slice pass, and the sum of the members' wait own time (each member's lag
behind the first member to see the completion) in both; then the swap terms of `fidelity_terms` for that kind
alone: its transfers only, its members' lags only, both (error % of the sweep on truth0's own inputs).
Analysis only.
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


def kinds_of_comms(config_dir: Path, truth, slice_of: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per comm: an index into a list of labels (group desc/size, members per slice, op, async, bytes), -1 for
    a comm that is not a collective."""
    ev = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0"),
                                columns=["rank", "seq", "op", "group_name", "bytes", "is_async"])
    order = np.lexsort((ev["seq"].to_numpy(), ev["rank"].to_numpy()))  # load_graph's order
    op = np.asarray(ev["op"].to_pylist(), dtype=object)[order]
    group = np.asarray(ev["group_name"].to_pylist(), dtype=object)[order]
    nbytes = ev["bytes"].to_numpy()[order]
    is_async = ev["is_async"].to_numpy(zero_copy_only=False)[order]
    groups = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0", "groups"),
                                    columns=["group_name", "group_desc", "size"]).to_pylist()
    desc = {str(g["group_name"]): f"{g['group_desc']}{g['size']}" for g in groups}
    g = truth.graph
    labels: dict[str, int] = {}
    out = np.full(g.n_comms, -1, dtype=np.int64)
    ops = np.flatnonzero((g.comm >= 0) & (g.kind == K_COLLECTIVE))
    members: dict[int, list[int]] = {}
    for i in ops:
        members.setdefault(int(g.comm[i]), []).append(int(i))
    for c, rows in members.items():
        i = rows[0]
        per_slice = np.bincount(slice_of[rows] - slice_of[rows].min())
        split = "+".join(str(int(x)) for x in per_slice if x)
        label = (f"{desc.get(str(group[i]), group[i])} [{split}] {op[i]} {'async' if is_async[i] else 'sync'} "
                 f"{int(nbytes[i])}B")
        out[c] = labels.setdefault(label, len(labels))
    return out, list(labels)


def report(config_dir: Path, pass_dir: str) -> list[str]:
    from prism.calibrate.stage import load_graph

    truth = load_graph(config_dir / "truth0")
    slice_of = ft.slice_of_events(config_dir, truth)
    across = ft.comm_classes(truth, slice_of)["collectives across slices"]
    kind_of, labels = kinds_of_comms(config_dir, truth, slice_of)
    own = ft.measured(truth)
    other = ft.slice_inputs(config_dir, truth, pass_dir)
    g = truth.graph
    waits = ft._wait_comm(g)
    it_comm = np.full(g.n_comms, -1, dtype=np.int64)
    ops = np.flatnonzero(g.comm >= 0)
    it_comm[g.comm[ops]] = truth.iteration[ops]
    n_it = max(1, len(np.unique(truth.iteration[truth.iteration >= 1])))
    base = ft.iteration_ms(truth, *own)

    def pct(dur, x) -> float:
        return 100 * (ft.iteration_ms(truth, dur, x) - base) / base

    lines = [f"{config_dir}  ({pass_dir}; collectives across slices by kind; ms per iteration, iterations >= 1; "
             f"sweep on truth0's own inputs {base:.2f} ms)",
             f"  {'kind':44s} {'n/it':>5s} {'x truth':>8s} {'x slice':>8s} {'lag truth':>9s} {'lag slice':>9s}"
             f" {'term x':>7s} {'term lag':>8s} {'term both':>9s}"]
    for k, label in enumerate(labels):
        cls = across & (kind_of == k)
        if not cls.any():
            continue
        later = cls & (it_comm >= 1)
        sel = (waits >= 0) & cls[np.maximum(waits, 0)]
        sel_later = sel & (truth.iteration >= 1)
        xt, xs = own[1][later].sum() / 1e6 / n_it, other[1][later].sum() / 1e6 / n_it
        lt, ls = own[0][sel_later].sum() / 1e6 / n_it, other[0][sel_later].sum() / 1e6 / n_it
        t_x = pct(own[0], np.where(cls, other[1], own[1]))
        t_l = pct(np.where(sel, other[0], own[0]), own[1])
        t_b = pct(np.where(sel, other[0], own[0]), np.where(cls, other[1], own[1]))
        lines.append(f"  {label:44s} {later.sum() / n_it:5.1f} {xt:8.2f} {xs:8.2f} {lt:9.2f} {ls:9.2f}"
                     f" {t_x:+6.1f}% {t_l:+7.1f}% {t_b:+8.1f}%")
    sel = (waits >= 0) & across[np.maximum(waits, 0)]
    lines.append(f"  {'all across slices':44s} {'':5s} {'':8s} {'':8s} {'':9s} {'':9s}"
                 f" {pct(own[0], np.where(across, other[1], own[1])):+6.1f}%"
                 f" {pct(np.where(sel, other[0], own[0]), own[1]):+7.1f}%"
                 f" {pct(np.where(sel, other[0], own[0]), np.where(across, other[1], own[1])):+8.1f}%")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="CONFIG_DIR")
    parser.add_argument("--pass", dest="pass_dir", default=job_files.SLICES,
                        choices=(job_files.SLICES, job_files.TIMED_SLICES))
    args = parser.parse_args(argv)
    status = 0
    for d in args.dirs:
        if not job_files.graph_dir(d / "truth0").is_dir() or not job_files.slices_dir(d / "prism0", args.pass_dir).is_dir():
            print(f"fidelity_across: error: {d} holds no truth0/graph and prism0/{args.pass_dir} (a config folder of "
                  "`prism bench fidelity --work DIR`)", file=sys.stderr)
            status = 2
            continue
        print("\n".join(report(d, args.pass_dir)), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
