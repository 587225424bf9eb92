"""Each prism run against the truth at its own minute: the host's level moves, so score a run by the truth runs
around it (issue 24; the bench's `--alternate` order: truth, prism, prism, truth, ...).

    python -m prism.bench.fidelity_paired STREAM_DIR [STREAM_DIR ...]

A STREAM_DIR holds a bench's `fidelity.json` and its config folders (`--work`, or a device call's artifacts
unpacked: `F/a`, `F/b`). Per prism run of a config: when its slices ran (their first event, host monotonic s), its
slices' load (`--slice-load`), its prediction against the truth's iteration time interpolated linearly between
the truth runs before and after it (the nearest one at the ends), and its slices' compute CPU against the
truths' interpolated the same way (every truth's and slice run's CPU taken over truth0's on the same events:
`fidelity_breakdown.whole_cpu_ratio`). Then per load: the runs' mean signed and mean |error| and compute ratio,
and per gap between two truths the loaded run minus the plain one. Nothing here feeds a prediction.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from prism.bench.fidelity_breakdown import sources, whole_cpu_ratio
from prism.bench.fidelity_table import ResultsError, read_json


def interpolate(times: list[float], values: list[float], at: float) -> float:
    """`values` at `at`, linear between the neighbouring `times` (sorted), the nearest value outside them."""
    return float(np.interp(at, times, values))


def config_runs(config_dir: Path, truth_ms: list[float], pred_ms: list[float], loads: list[str]) -> list[dict]:
    per, began = sources(config_dir)
    base = per["truth0"]
    truths = sorted((began[f"truth{i}"], ms, whole_cpu_ratio(base, per[f"truth{i}"]))
                    for i, ms in enumerate(truth_ms) if f"truth{i}" in per)
    t_times, t_ms, t_cpu = (list(x) for x in zip(*truths))
    rows = []
    for i, ms in enumerate(pred_ms):
        name = "slices" if i == 0 else f"prism{i} slices"
        if name not in per:
            continue
        at = began[name]
        truth = interpolate(t_times, t_ms, at)
        cpu_truth = interpolate(t_times, t_cpu, at)
        rows.append({"run": i, "load": loads[i] if i < len(loads) else "none", "began": at, "pred_ms": ms,
                     "truth_ms": truth, "error_pct": 100 * (ms - truth) / truth,
                     "cpu": whole_cpu_ratio(base, per[name]) / cpu_truth,
                     "gap": sum(t < at for t in t_times)})
    return rows


def _stream(d: Path) -> str:
    """A stream's name in the table: its folder, and its parent's where that names a call (callN/a)."""
    return f"{d.parent.name}/{d.name}" if d.parent.name.startswith("call") else d.name


def compute_fit(errors: list[float], ratios: list[float]) -> str:
    """How much of the runs' errors their slices' compute speed explains: the correlation and least-squares line of
    error % on (compute ratio - 1) x 100, and what is left of each error once that term is taken off at slope 1
    (a prediction whose slices computed k % slow is expected ~k % high, the rest being the other terms)."""
    term = [100.0 * (c - 1.0) for c in ratios]
    left = [e - t for e, t in zip(errors, term)]
    tail = f"{statistics.mean(left):+.1f}, {statistics.mean(abs(v) for v in left):.1f}"
    if len(errors) < 3 or statistics.pstdev(term) == 0 or statistics.pstdev(errors) == 0:
        return f"- | {tail}"
    slope, intercept = np.polyfit(term, errors, 1)
    return f"{np.corrcoef(term, errors)[0, 1]:.2f}, {slope:.2f}, {intercept:+.1f} | {tail}"


def report(stream_dirs: list[Path]) -> list[str]:
    lines = ["| stream | config | run | load | slices began s | prism ms | truth there ms | error % | "
             "slices' compute CPU / truth's there |", "|---|---|---|---|---|---|---|---|---|"]
    every: list[dict] = []
    for d in stream_dirs:
        for r in read_json(d / "fidelity.json"):
            if not r.ok:
                continue
            rows = config_runs(d / r.cfg.name, r.truth_ms, r.pred_ms, r.variant)
            for x in rows:
                x.update(config=r.cfg.name, stream=_stream(d))
                lines.append(f"| {_stream(d)} | {r.cfg.name} | {x['run']} | {x['load']} | {x['began']:.1f} | "
                             f"{x['pred_ms']:.2f} | {x['truth_ms']:.2f} | {x['error_pct']:+.1f} | {x['cpu']:.3f} |")
            every += rows
    lines += ["", "| load | prism runs | mean signed error % | mean \\|error\\| % | compute CPU / truth's: mean (min-max) "
              "| error against the compute term (ratio - 1, %): r, slope, intercept | error minus the compute term: "
              "mean, mean \\|.\\| % |", "|---|---|---|---|---|---|---|"]
    for load in sorted({x["load"] for x in every}):
        xs = [x for x in every if x["load"] == load]
        errs, cpus = [x["error_pct"] for x in xs], [x["cpu"] for x in xs]
        lines.append(f"| {load} | {len(xs)} | {statistics.mean(errs):+.1f} | "
                     f"{statistics.mean(abs(e) for e in errs):.1f} | {statistics.mean(cpus):.3f} "
                     f"({min(cpus):.3f}-{max(cpus):.3f}) | {compute_fit(errs, cpus)} |")
    pairs = []
    for key in sorted({(x["stream"], x["config"], x["gap"]) for x in every}):
        xs = [x for x in every if (x["stream"], x["config"], x["gap"]) == key]
        plain = [x for x in xs if x["load"] == "none"]
        loaded = [x for x in xs if x["load"] != "none"]
        if len(plain) == 1 and len(loaded) == 1:
            pairs.append((key, loaded[0]["load"], loaded[0]["error_pct"] - plain[0]["error_pct"],
                          loaded[0]["cpu"] - plain[0]["cpu"]))
    if pairs:
        lines += ["", "| stream | config | gap | load | error: loaded minus plain, points | compute ratio: loaded "
                  "minus plain |", "|---|---|---|---|---|---|"]
        lines += [f"| {s} | {c} | {g} | {load} | {de:+.1f} | {dc:+.3f} |" for (s, c, g), load, de, dc in pairs]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_paired", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="STREAM_DIR")
    args = parser.parse_args(argv)
    try:
        print("\n".join(report(args.dirs)))
    except ResultsError as exc:
        print(f"prism fidelity_paired: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
