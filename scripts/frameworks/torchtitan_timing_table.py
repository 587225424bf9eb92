"""The table of scripts/frameworks/torchtitan_timing.sh, from the raw results it keeps (docs/results/frameworks/timing_w2/:
session 11, plain torchrun; timing_w2_s15/: session 15, torchrun's ranks pinned one core each).

Every run, in the order it ran: torchrun (the truth: as runs.txt's header says, plain or pinned), the pipeline's pinned baseline (prism's own
truth: a real run, one core per rank) and the pipeline's prediction (calibrated from the slice runs). Iteration
times are prism's definition (`prism/iterations.py`): iteration k of the job ends when its last rank ends step
k+1, the gaps k = 1..n-1 (the first step, start-up, left out). For torchrun and the baseline the step's end is
the wrapper's line, printed when torchtitan logs the step (examples/torchtitan/cpu_train.py); the baseline's
graph gives its `iteration_end` markers too. Per step (median over ranks and steps 2..n): the main thread's CPU
time (`thread_time`), the process's (`process_time`, gloo's threads included) and the main thread's run delay
(time runnable but waiting for a core, from the kernel's schedstat: the cost of a shared box), and each rank's
(median over its steps 2..n). Where the run's load samples were kept (load_NAME.txt, session 15): the box's
1-minute load average and its runnable tasks (the sampler itself is one of them) while the timed steps ran (the
wrapper's step 1 to step n lines, 2 s either side; the baseline's for a pipeline run), median and max.
Then the bar: each pipeline run's predicted median iteration time against torchrun's per-step spread (min-max of
every torchrun step of the matrix, pooled; and of the two torchruns either side of it).

    .venv/bin/python scripts/frameworks/torchtitan_timing_table.py docs/results/frameworks/timing_w2_s15
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prism.iterations import iteration_times

LINE = re.compile(r"rank (\d+) step (\d+) loss (\S+) wall ([0-9.]+) cpu ([0-9.]+) proc ([0-9.]+) delay ([-0-9.]+)")


def wrapper_lines(path: Path) -> dict[tuple[int, int], tuple[float, float, float, float]]:
    """(rank, step) -> (wall, thread cpu, process cpu, main thread's run delay) in seconds, from the wrapper's lines."""
    out = {}
    for m in LINE.finditer(path.read_text()):
        out[int(m[1]), int(m[2])] = (float(m[4]), float(m[5]), float(m[6]), float(m[7]))
    return out


def from_lines(lines) -> tuple[np.ndarray, float, float, float]:
    """(job iteration times in ms; medians per rank and step, ms: main-thread CPU, process CPU, main-thread run
    delay)."""
    ranks = sorted({r for r, _ in lines})
    steps = sorted({s for _, s in lines})
    ends = np.array([max(lines[r, s][0] for r in ranks) for s in steps])
    cpu = [lines[r, s][1] - lines[r, s - 1][1] for r in ranks for s in steps[1:]]
    proc = [lines[r, s][2] - lines[r, s - 1][2] for r in ranks for s in steps[1:]]
    delay = [lines[r, s][3] - lines[r, s - 1][3] for r in ranks for s in steps[1:]]
    return (np.diff(ends) * 1e3, float(np.median(cpu)) * 1e3, float(np.median(proc)) * 1e3,
            float(np.median(delay)) * 1e3)


def rank_delays(lines) -> list[float]:
    """Each rank's main-thread run delay per step (ms; median over its steps 2..n), in rank order."""
    ranks = sorted({r for r, _ in lines})
    steps = sorted({s for _, s in lines})
    return [float(np.median([lines[r, s][3] - lines[r, s - 1][3] for s in steps[1:]])) * 1e3 for r in ranks]


def load_during(folder: Path, name: str, lines) -> str:
    """The box's load while the timed steps ran (the wrapper's first to last step line, 2 s either side):
    "load1 MED/MAX, runnable MED/MAX" from load_NAME.txt's samples (uptime, 1-minute load, runnable/all); '' if
    the run kept none (a note says so)."""
    f = folder / f"load_{name}.txt"
    if not f.exists():
        return "load not sampled (before session 15)"
    walls = [v[0] for v in lines.values()]
    lo, hi = min(walls) - 2, max(walls) + 2
    samples = []
    for line in f.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and lo <= float(parts[0]) <= hi:
            samples.append((float(parts[1]), int(parts[2].split("/")[0])))
    if not samples:
        return "no load sample"
    load = [a for a, _ in samples]
    run = [b for _, b in samples]
    return (f"load1 {np.median(load):.2f}/{max(load):.2f}, runnable {np.median(run):.0f}/{max(run)}"
            f" ({len(samples)} samples)")


def from_ends(iteration, end_ns) -> np.ndarray:
    return iteration_times(iteration, end_ns).gaps_ns / 1e6


def row(name: str, what: str, gaps_ms: np.ndarray, clocks: tuple[float, float, float] | None = None) -> str:
    each = " ".join(f"{g:.0f}" for g in gaps_ms)
    cols = " ".join(f"{c:9.1f}" for c in clocks) if clocks else " " * 29
    return (f"{name:<11} {what:<34} {np.median(gaps_ms):8.1f} {gaps_ms.min():8.1f} {gaps_ms.max():8.1f}"
            f" {cols}  {each}")


def kinds(path: Path, column: str) -> dict[str, float]:
    """Median over (rank, iteration >= 1) of each kind's summed `column` (ms)."""
    per = defaultdict(list)
    with path.open() as f:
        for r in csv.DictReader(f):
            if int(r["iteration"]) >= 1 and r[column] not in ("", None):
                per[r["kind"]].append(int(r[column]) / 1e6)
    return {k: float(np.median(v)) for k, v in sorted(per.items())}


def main(folder: Path) -> None:
    print((folder / "runs.txt").read_text().rstrip())
    print()
    print(f"{'run':<11} {'iteration time (ms)':<34} {'median':>8} {'min':>8} {'max':>8} {'cpu/step':>9} {'proc/step':>9} {'delay':>9}  each")
    names = sorted({p.name.split("_")[0] + "_" + p.name.split("_")[1].split(".")[0]
                    for p in folder.glob("*_*") if p.name.startswith(("torchrun_", "prism_"))},
                   key=lambda n: (int(n.split("_")[1]), n.startswith("prism")))
    truth: dict[int, np.ndarray] = {}  # torchrun i -> its per-step times (ms)
    predicted: dict[int, np.ndarray] = {}  # pipeline run i -> its predicted iteration times (ms)
    baseline: dict[int, np.ndarray] = {}
    context: list[str] = []  # each run's rank delays and load, printed after the table
    for name in names:
        if name.startswith("torchrun"):
            lines = wrapper_lines(folder / f"{name}.txt")
            gaps, *clocks = from_lines(lines)
            truth[int(name.split("_")[1])] = gaps
            print(row(name, "torchrun, wall per step", gaps, clocks))
            context.append(f"{name:<11} torchrun  run delay per step by rank (ms): "
                           + " ".join(f"{d:.1f}" for d in rank_delays(lines)) + "; " + load_during(folder, name, lines))
            continue
        lines = folder / f"{name}_baseline_lines.txt"
        if not lines.exists() or not wrapper_lines(lines):
            print(f"{name:<11} (no results: see runs.txt)")
            continue
        lines = wrapper_lines(lines)
        gaps, *clocks = from_lines(lines)
        baseline[int(name.split("_")[1])] = gaps
        print(row(name, "baseline (pinned), wall per step", gaps, clocks))
        context.append(f"{name:<11} baseline  run delay per step by rank (ms): "
                       + " ".join(f"{d:.1f}" for d in rank_delays(lines)) + "; " + load_during(folder, name, lines))
        with (folder / f"{name}_baseline_ends.csv").open() as f:
            ends = list(csv.DictReader(f))
        print(row(name, "baseline, iteration_end markers",
                  from_ends([int(e["iteration"]) for e in ends], [int(e["t_end_ns"]) for e in ends])))
        it = pq.read_table(folder / f"{name}_predicted_iterations.parquet").to_pydict()
        predicted[int(name.split("_")[1])] = from_ends(it["iteration"], it["end_ns"])
        print(row(name, "PREDICTED (calibrated)", predicted[int(name.split("_")[1])]))
    print()
    print("each run's main-thread run delay by rank and the box's load while its timed steps ran"
          " (median/max of the 2-s samples)")
    for line in context:
        print(line)
    print()
    bar(truth, predicted, baseline)
    print()
    print("time by kind, ms per rank and iteration (median over ranks, iterations >= 1): predicted span;"
          " baseline span / CPU")
    for name in names:
        if name.startswith("prism") and (folder / f"{name}_predicted_kinds.csv").exists():
            pred = kinds(folder / f"{name}_predicted_kinds.csv", "span_ns")
            span = kinds(folder / f"{name}_baseline_kinds.csv", "span_ns")
            cpu = kinds(folder / f"{name}_baseline_kinds.csv", "cpu_ns")
            for k in sorted(set(pred) | set(span)):
                print(f"{name:<11} {k:<11} predicted {pred.get(k, 0):8.1f}   baseline {span.get(k, 0):8.1f}"
                      f" / {cpu.get(k, 0):8.1f}")
    print()
    print("compute events by size (slice durations' quartiles): CPU time of the same events, baseline and capture"
          " over the slices'")
    for name in names:
        if name.startswith("prism"):
            compute_by_size(folder, name)


def bar(truth: dict[int, np.ndarray], predicted: dict[int, np.ndarray], baseline: dict[int, np.ndarray]) -> None:
    """The issue's bar: a pipeline run's predicted median iteration time within torchrun's min-max per-step spread
    (every torchrun step of the matrix pooled; and the two torchruns either side of the pipeline run: i and i+1)."""
    if not truth or not predicted:
        return
    pooled = np.concatenate(list(truth.values()))
    medians = [float(np.median(g)) for g in truth.values()]
    print(f"torchrun, every step of the {len(truth)} runs pooled: median {np.median(pooled):.1f}, min-max"
          f" {pooled.min():.1f}-{pooled.max():.1f} ms; the runs' medians {min(medians):.1f}-{max(medians):.1f} ms")

    def against(value: float, lo: float, hi: float) -> str:
        if lo <= value <= hi:
            return "within"
        edge = lo if value < lo else hi
        return f"OUTSIDE by {value - edge:+.1f} ms ({(value - edge) / edge * 100:+.1f} % of {edge:.1f})"

    for i, gaps in sorted(predicted.items()):
        med = float(np.median(gaps))
        near = np.concatenate([truth[j] for j in (i, i + 1) if j in truth])
        line = (f"prism_{i:<5} PREDICTED median {med:.1f} ms: pooled spread {pooled.min():.1f}-{pooled.max():.1f}"
                f" {against(med, pooled.min(), pooled.max())}; torchrun_{i}+{i + 1}'s {near.min():.1f}-{near.max():.1f}"
                f" {against(med, near.min(), near.max())}; vs torchrun's pooled median {np.median(pooled):.1f}:"
                f" {(med / np.median(pooled) - 1) * 100:+.1f} %")
        if i in baseline:
            line += f"; vs its pinned baseline's median {np.median(baseline[i]):.1f}: {(med / np.median(baseline[i]) - 1) * 100:+.1f} %"
        print(line)


COMPUTE_BY_SIZE = """
WITH b AS (SELECT rank, seq, kind, device_ns AS b_ns FROM read_parquet($base)),
     g AS (SELECT event_id, rank, seq, kind, iteration, device_ns AS c_ns FROM read_parquet($capture)),
     s AS (SELECT event_id, duration_ns AS s_ns FROM read_parquet($slices)),
     j AS (SELECT b_ns, c_ns, s_ns, ntile(4) OVER (ORDER BY s_ns) AS q
           FROM g JOIN b USING (rank, seq, kind) JOIN s USING (event_id) WHERE g.iteration >= 1 AND g.kind = 'compute')
SELECT q, count(*) AS n, sum(s_ns) / 1e6 AS slice_ms, sum(b_ns) / sum(s_ns) AS base, sum(c_ns) / sum(s_ns) AS capture
FROM j GROUP BY ALL ORDER BY q
"""


def compute_by_size(folder: Path, name: str) -> None:
    """The same compute events (iterations >= 1, matched by rank and program order) on three clocks: the slice
    runs' durations (what the prediction sums), the baseline's and the capture's CPU time, by quartile of size."""
    files = {k: folder / f"{name}_{k}.parquet" for k in ("baseline_events", "events", "slice_durations")}
    if not all(f.exists() for f in files.values()):
        return
    import duckdb

    rows = duckdb.sql(COMPUTE_BY_SIZE, params={"base": str(files["baseline_events"]), "capture": str(files["events"]),
                                               "slices": str(files["slice_durations"])}).fetchall()
    for q, n, slice_ms, base, capture in rows:
        print(f"{name:<11} quartile {q}: {n:4d} events, {slice_ms:8.1f} ms in the slices;"
              f" baseline CPU / slices {base:.3f}, capture CPU / slices {capture:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
