"""Does one stream's work slow the other's? (issue 24, session 19) A device call of the fidelity bench runs two
streams at once, each on its own 8 cores (taskset 0-7 and 8-15); session 18 found a core's speed depends on how
many of the host's cores are busy. Per stream and source (every truth run, capture, slice pass and emulation of
every config, from their events' first start to last end on the host's monotonic clock, which both streams share):
its compute CPU time over its config's truth0 on the same events (`fidelity_breakdown.whole_cpu_ratio`; truth runs
and slice passes only) and the other stream's busy cores while it ran (a truth run or a capture keeps the W=8 ranks
busy: 8; a slice pass P=4 ranks and the replay server: 5; an emulation its 4 sandbox ranks and the replay worker: 5;
anything else, idle: 0, time-weighted over the window).

    python3 scripts/stream_overlap.py F/a F/b        (a device call's two streams, unpacked)

Prints the sources and, per kind (truth, slices), the correlation of the compute ratio (over the config's median of
that kind) with the other stream's busy cores, and the mean ratio when the other stream was busier than 6 cores
against less than 2. Nothing here feeds a prediction.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from prism.bench.fidelity_breakdown import sources, whole_cpu_ratio

BUSY = {"truth": 8, "capture": 8, "slices": 5, "emulation": 5}


def _window(paths: list[Path]) -> tuple[float, float] | None:
    """First start to last end of the events in `paths` (an emulation's: its sandbox rows, which ran then)."""
    lo, hi = [], []
    for p in paths:
        names = pq.read_schema(p).names
        t = pq.read_table(p, columns=["t_start_ns", "t_end_ns"] + (["source"] if "source" in names else []))
        if "source" in names:
            t = t.filter(pa.compute.equal(t["source"], "sandbox"))
        if t.num_rows:
            lo.append(min(t["t_start_ns"].to_numpy()))
            hi.append(max(t["t_end_ns"].to_numpy()))
    return (min(lo) / 1e9, max(hi) / 1e9) if lo else None


def windows(stream: Path) -> list[dict]:
    """Every source of every config in `stream`: kind, config, name, window (s), compute ratio (or None)."""
    out = []
    for config in sorted(p for p in stream.iterdir() if (p / "truth0").is_dir()):
        per, _ = sources(config)
        base = per.get("truth0", {})
        for truth in sorted(config.glob("truth[0-9]*")):
            w = _window([truth / "graph" / "events.parquet"])
            if w:
                out.append({"kind": "truth", "config": config.name, "name": truth.name, "w": w,
                            "ratio": whole_cpu_ratio(base, per[truth.name]) if truth.name in per else None})
        for job in sorted(config.glob("prism[0-9]*")):
            label = "slices" if job.name == "prism0" else f"{job.name} slices"
            for kind, paths in (("capture", [job / "graph" / "events.parquet"]),
                                ("slices", sorted((job / "slices").glob("slice=*/events.parquet"))),
                                ("emulation", [job / "emulation" / "events.parquet"])):
                paths = [p for p in paths if p.is_file()]
                w = _window(paths) if paths else None
                if w:
                    ratio = whole_cpu_ratio(base, per[label]) if kind == "slices" and label in per else None
                    out.append({"kind": kind, "config": config.name, "name": f"{job.name} {kind}", "w": w,
                                "ratio": ratio})
    return out


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def busy_during(window: tuple[float, float], other: list[dict]) -> float:
    """The other stream's busy cores, time-weighted over `window`."""
    lo, hi = window
    total = 0.0
    for o in other:
        overlap = min(hi, o["w"][1]) - max(lo, o["w"][0])
        if overlap > 0:
            total += overlap * BUSY[o["kind"]]
    return total / max(hi - lo, 1e-9)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    streams = [windows(Path(d)) for d in argv]
    print("| stream | config | source | began s | s | compute ratio vs truth0 | over the config's median of its kind "
          "| other stream's busy cores |\n|---|---|---|---|---|---|---|---|")
    rows = []
    for k, (mine, other) in enumerate(((streams[0], streams[1]), (streams[1], streams[0]))):
        for s in mine:
            s["busy"] = busy_during(s["w"], other)
        for kind in ("truth", "slices"):
            for config in sorted({s["config"] for s in mine}):
                xs = [s for s in mine if s["kind"] == kind and s["config"] == config and s["ratio"]]
                med = statistics.median(s["ratio"] for s in xs) if xs else None
                for s in xs:
                    s["rel"] = s["ratio"] / med
        for s in mine:
            rel = s.get("rel")
            print(f"| {Path(argv[k]).name} | {s['config']} | {s['name']} | {s['w'][0]:.1f} | {s['w'][1] - s['w'][0]:.1f} | "
                  f"{_f(s['ratio'])} | {_f(rel)} | "
                  f"{s['busy']:.1f} |")
            if rel is not None:
                rows.append((s["kind"], rel, s["busy"]))
    print("\n| kind | sources | r(compute ratio over the config's median, other stream's busy cores) | mean ratio: other "
          "busy > 6 | other busy < 2 |\n|---|---|---|---|---|")
    for kind in ("truth", "slices"):
        xs = [(r, b) for k, r, b in rows if k == kind]
        if len(xs) < 3:
            continue
        rel, busy = np.array([x[0] for x in xs]), np.array([x[1] for x in xs])
        hi, lo = rel[busy > 6], rel[busy < 2]
        print(f"| {kind} | {len(xs)} | {np.corrcoef(rel, busy)[0, 1]:+.2f} | "
              f"{hi.mean() if hi.size else float('nan'):.3f} ({hi.size}) | {lo.mean() if lo.size else float('nan'):.3f} ({lo.size}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
