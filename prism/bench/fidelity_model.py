"""The model on the truth's own inputs: the calibration sweep fed with a real run's own measurements.

    python -m prism.bench.fidelity_model JOB_DIR [JOB_DIR ...] [--rule measured|bare]

A JOB_DIR holds ``graph/`` of a real run (`prism launch --mode real`, then `prism graph`; the fidelity bench's
``truth0``; the committed fixtures `tests/data/fidelity/*`). Per run it prints the run's own iteration time
(`prism.iterations`: median over k >= 1), the sweep's on the same graph with the run's own durations and
transfers, and the error. ``--rule measured`` (default) takes them as the slice runs do
(`prism.calibrate.durations.measured_run`: compute and markers their wall span, a comm's transfer its first
member's delay, a wait its own time after the completion); ``--rule bare`` as before session 9 (`bare_graph` durations:
compute its CPU time, and each comm's transfer the mean member delay of the slice rule).

What is left of the error is the model's own: the inputs are right by construction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def self_sweep(job_dir: Path, rule: str = "measured") -> tuple[float, float]:
    """(the run's own iteration time, the sweep's on its own inputs), ms."""
    from prism.calibrate import durations as rules
    from prism.calibrate.from_slices import slice_delays
    from prism.calibrate.stage import iterations_table, load_graph
    from prism.calibrate.sweep import discover
    from prism.iterations import iteration_times

    tj = load_graph(job_dir)
    g, c = tj.graph, tj.columns
    args = (g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"], c["t_end_ns"], c["t_complete_ns"], g.n_comms)
    if rule == "measured":
        dur, transfer = rules.measured_run(*args)
    elif rule == "bare":
        dur, _ = rules.bare_graph(*args)
        total, count = slice_delays(g.kind, g.comm, g.wait_op, c["t_start_ns"], c["t_end_ns"], c["t_complete_ns"],
                                    np.arange(len(tj.event_ids)), g.n_comms)
        transfer = np.where(count > 0, total // np.maximum(count, 1), 0).astype(np.int64)
    else:
        raise ValueError(f"rule {rule!r}: measured or bare")
    _, timeline = discover(g, dur, transfer)
    it = iterations_table(tj, timeline)
    swept = iteration_times(it["iteration"].to_numpy(), it["end_ns"].to_numpy()).median_ms
    ends = np.flatnonzero(tj.iteration_end)
    truth = iteration_times(tj.iteration[ends], c["t_end_ns"][ends]).median_ms
    return truth, swept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="JOB_DIR")
    parser.add_argument("--rule", choices=("measured", "bare"), default="measured")
    args = parser.parse_args(argv)
    from prism import job as job_files

    status = 0
    print(f"| run | truth ms | sweep ms ({args.rule}) | error % |\n|---|---|---|---|")
    for d in args.dirs:
        if not job_files.graph_file(d).is_file():
            print(f"prism fidelity_model: error: {d} holds no graph/events.parquet (a real run's job folder "
                  "after `prism graph`)", file=sys.stderr)
            status = 2
            continue
        truth, swept = self_sweep(d, args.rule)
        print(f"| {d.name} | {truth:.2f} | {swept:.2f} | {100 * (swept - truth) / truth:+.2f} |", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
