"""The emulation's tail sweep (`prism.emulate.tail.sweep_tails`) before and after, in one run, on a synthetic W=1024
graph: .venv/bin/python scripts/tail_timing.py [--before REV] [--repeats N] [--microbatches M] [--out FILE.json]

'before' is prism/emulate/tail.py at REV (default 4a8477b: its own cursor/clock loop), loaded from git; 'after'
is this tree's (the calibrate sweep with pinned rows). The graph is `prism.calibrate.synthetic.training_graph`
at W=1024 (tp8 pp8 dp16 ep8; 6 microbatches: ~1.5 M events). The live rows mimic one emulate launch: one
sandbox rank (tp=0, dp=0 of the last stage) live throughout, and its TP and DP peers (the replay's cone) live up
to a random row of their second half, each live row late by a random lag that grows along the rank (the
measured clock runs behind the model); the computed rows are placed as `prism.emulate.outputs.build` places
them before the tail (`one_clock`). Both versions run on the same inputs, interleaved (before, after, before,
...) after one warm-up each (numba's compile or cache load); every run's wall and thread CPU time is printed
and written, and the two outputs are compared bit for bit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from prism.calibrate.sweep import sweep  # noqa: E402
from prism.calibrate.synthetic import Layout, training_graph  # noqa: E402
from prism.emulate import tail as after  # noqa: E402
from prism.emulate.outputs import one_clock  # noqa: E402


def load_before(rev: str):
    text = subprocess.run(["git", "show", f"{rev}:prism/emulate/tail.py"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "tail_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("tail_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(layout: Layout, seed: int = 0):
    """(graph, live, durations, transfers, start, end): what `outputs.build` hands the tail."""
    syn = training_graph(layout, seed=seed)
    g = syn.graph
    swept = sweep(g, syn.durations, syn.transfer)
    rng = np.random.default_rng(seed)
    rank = lambda tp, dp, pp: (pp * layout.dp + dp) * layout.tp + tp  # noqa: E731 (synthetic: TP fastest, then DP)
    sandbox = rank(0, 0, layout.pp - 1)
    peers = [rank(t, 0, layout.pp - 1) for t in range(1, layout.tp)] + [rank(0, d, layout.pp - 1)
                                                                        for d in range(1, layout.dp)]
    source = np.zeros(g.n_events, dtype=np.int8)
    lo, hi = g.rank_ptr[sandbox], g.rank_ptr[sandbox + 1]
    source[lo:hi] = 2
    for r in peers:
        lo, hi = int(g.rank_ptr[r]), int(g.rank_ptr[r + 1])
        source[lo : lo + int(rng.integers((hi - lo) // 2, hi - lo))] = 1
    live = source != 0
    lag = np.zeros(g.n_events, dtype=np.int64)
    for r in [sandbox, *peers]:
        lo, hi = int(g.rank_ptr[r]), int(g.rank_ptr[r + 1])
        lag[lo:hi] = np.cumsum(rng.integers(0, 200, hi - lo))
    start = np.where(live, swept.start_ns + lag, swept.start_ns)
    end = np.where(live, swept.end_ns + lag + rng.integers(0, 100, g.n_events), swept.end_ns)
    start, end = one_clock(g.rank_ptr, source, swept, start, end)
    return g, live, syn.durations, syn.transfer, start, end


def timed(fn, args):
    w0, c0 = time.perf_counter(), time.thread_time()
    out = fn(*args)
    return out, time.perf_counter() - w0, time.thread_time() - c0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="4a8477b")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=6)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    before = load_before(args.before)
    layout = Layout(tp=8, pp=8, dp=16, ep=8, microbatches=args.microbatches, layers=5, iterations=2, buckets=4)
    data = inputs(layout)
    g, live = data[0], data[1]
    versions = {"before": before.sweep_tails, "after": after.sweep_tails}
    outs = {name: timed(fn, data)[0] for name, fn in versions.items()}  # warm-up: compile or load numba's cache
    same = all(np.array_equal(a, b) for a, b in zip(outs["before"], outs["after"]))
    runs = []
    for k in range(args.repeats):
        for name, fn in versions.items():
            _, wall, cpu = timed(fn, data)
            runs.append({"repeat": k, "version": name, "wall_s": round(wall, 4), "cpu_s": round(cpu, 4)})
            print(f"repeat {k} {name:6s} wall {wall:.3f} s  thread cpu {cpu:.3f} s", flush=True)
    med = {name: {key: float(np.median([r[key] for r in runs if r["version"] == name])) for key in ("wall_s", "cpu_s")}
           for name in versions}
    load = os.getloadavg()
    print(f"W={g.n_ranks}, {g.n_events} events, {g.n_comms} comms, {int(live.sum())} live rows; identical outputs: "
          f"{same}; medians: " + ", ".join(f"{n} wall {m['wall_s']:.3f} s cpu {m['cpu_s']:.3f} s" for n, m in med.items())
          + f"; load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.out:
        args.out.write_text(json.dumps({
            "command": "scripts/tail_timing.py " + " ".join(sys.argv[1:]), "before": args.before,
            "world": g.n_ranks, "events": g.n_events, "comms": g.n_comms, "live_rows": int(live.sum()),
            "identical": same, "loadavg": [round(x, 2) for x in load], "runs": runs, "median": med,
        }, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
