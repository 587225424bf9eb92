"""The calibrate sweep before and after a change, interleaved: .venv/bin/python scripts/sweep_ab.py [--before REV]
[--rounds N] [--ranks W]

'before' is prism/ at REV (default 4a8477b), unpacked with `git archive` into a temporary folder; 'after' is this
tree's. Each round runs one process per tree, before then after: on `training_graph(layout_for(W))` (W=1024: 2.0 M
events) it times, in thread CPU seconds (medians), `discover` (3 runs), the replay kernel
(`Schedule.replay_scheduled`, 31 runs) and the whole replay (`Schedule.replay`, 5 runs), after one warm-up
(numba's compile or cache load). Every round's line is printed, and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(tree: str, label: str, ranks: int) -> None:
    sys.path.insert(0, tree)
    import numpy as np

    import prism
    from prism.calibrate.sweep import Timeline, discover
    from prism.calibrate.synthetic import layout_for, training_graph

    assert Path(prism.__file__).resolve().is_relative_to(Path(tree).resolve()), prism.__file__
    warm = training_graph(layout_for(2), seed=0)
    discover(warm.graph, warm.durations, warm.transfer)[0].replay(warm.durations, warm.transfer)
    syn = training_graph(layout_for(ranks), seed=ranks)

    def cpu(fn, k: int) -> float:
        runs = []
        for _ in range(k):
            began = time.thread_time()
            fn()
            runs.append(time.thread_time() - began)
        return statistics.median(runs)

    disc = cpu(lambda: discover(syn.graph, syn.durations, syn.transfer), 3)
    sched, _ = discover(syn.graph, syn.durations, syn.transfer)
    dur_s, xfer_s = sched.to_schedule(syn.durations), sched.transfer_to_schedule(syn.transfer)
    end_s = np.zeros(syn.graph.n_events, np.int64)
    kernel = cpu(lambda: sched.replay_scheduled(dur_s, xfer_s, out=end_s), 31)
    out = Timeline.empty(syn.graph.n_events, syn.graph.n_comms)
    sched.replay(syn.durations, syn.transfer, out=out)
    e2e = cpu(lambda: sched.replay(syn.durations, syn.transfer, out=out), 5)
    print(f"{label:6s} W={ranks} {syn.graph.n_events} events: discover {disc * 1e3:.1f} ms, replay kernel "
          f"{kernel * 1e3:.2f} ms, replay e2e {e2e * 1e3:.1f} ms (thread CPU, medians)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="4a8477b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # a worker process: measure this tree
    parser.add_argument("--label", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tree:
        measure(args.tree, args.label, args.ranks)
        return 0
    with tempfile.TemporaryDirectory() as before:
        archive = subprocess.run(["git", "archive", args.before, "prism"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        for _ in range(args.rounds):
            for label, tree in (("before", before), ("after", str(REPO))):
                subprocess.run([sys.executable, __file__, "--tree", tree, "--label", label, "--ranks",
                                str(args.ranks)], check=True)
        print(f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
