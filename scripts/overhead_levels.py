"""What session 13's H200 overhead calls say about PrismTrace's cost once each run's own speed is taken out
(issue 21 item 6), from the returned files only:

    .venv/bin/python scripts/overhead_levels.py docs/results/frameworks/s13-h200 [docs/results/frameworks/s12-h200]

1. `prism bench overhead`'s per-round run medians (the `round i/n variant median X ms` lines of
   overhead_5rounds/launch.txt and larger.txt; session 12's single round from its table): each round's ratio to
   the none run of that round, their median and min..max (`prism.bench.overhead_stats`, as the bench now prints);
2. overhead_profile/results.tgz: every run's per-step times (profile/steps.tsv) with its median, p10, p90;
3. the two torch.profiler traces (none, prismtrace; 3 steps each): the GPU's kernel time, and each CPU op's
   median duration in one run against the other (the same ops, the same counts: a ratio far from 1 on ops
   PrismTrace never touches is the run's CPU speed, not PrismTrace);
4. PrismTrace's entry points under cProfile (prismtrace-prism-calls.tsv): their inclusive time per step.
"""

from __future__ import annotations

import collections
import csv
import gzip
import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

from prism.bench import overhead_stats as stats

ROUND = re.compile(r"round (\d+)/(\d+) (\S+)\s+median\s+([\d.]+) ms")
ROW = re.compile(r"^(none|prismtrace|profiler)\s+([\d.]+)\s")
OPS = ("aten::as_strided", "aten::view", "aten::t", "aten::empty", "aten::mul", "aten::mm", "cudaLaunchKernel",
       "cudaMemcpyAsync", "cudaStreamSynchronize")
ENTRY_POINTS = ("pre (prism/runtime/markers.py", "post (prism/runtime/markers.py", "_bwd_begin (",
                "end (prism/runtime/markers.py", "step_pre (", "step_post (")


def round_medians(text: str) -> dict[str, list[float]]:
    """variant -> each round's run median, in round order (the bench's stderr lines)."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for _, _, variant, ms in ROUND.findall(text):
        out[variant].append(float(ms))
    return dict(out)


def paired_lines(name: str, medians: dict[str, list[float]]) -> list[str]:
    per_run = {v: [[m] for m in ms] for v, ms in medians.items()}  # a run's median stands for the run
    pairs = stats.paired(per_run)
    lines = [f"{name}: rounds {len(medians['none'])}; run medians ms: "
             + "; ".join(f"{v} " + " ".join(f"{m:.1f}" for m in ms) for v, ms in medians.items())]
    for v, p in pairs.items():
        lines.append(f"  {v}/none per round: " + " ".join(f"{100 * (r - 1):+.1f}%" for r in p.ratios)
                     + f"  -> median {100 * p.overhead:+.1f}%, min..max {100 * (min(p.ratios) - 1):+.1f}.."
                     f"{100 * (max(p.ratios) - 1):+.1f}%" + (f"  [{w}]" if (w := stats.verdict(
                         p, stats.level_spread(per_run["none"]))) else ""))
    return lines


def one_round_tables(text: str) -> list[dict[str, list[float]]]:
    """Each `prism bench overhead` table of a one-round call: its rows' medians are the runs' medians."""
    tables = []
    for table in text.split("prism bench overhead:")[1:]:
        meds: dict[str, list[float]] = collections.defaultdict(list)
        for line in table.splitlines():
            if m := ROW.match(line):
                meds[m.group(1)].append(float(m.group(2)))
        tables.append(dict(meds))
    return tables


def read_tgz(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def step_lines(steps_tsv: bytes) -> list[str]:
    runs: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for row in csv.DictReader(io.StringIO(steps_tsv.decode()), delimiter="\t"):
        runs[(row["variant"], row["profiler"])].append(float(row["ms"]))
    lines = []
    for (variant, profiler), ms in runs.items():
        d = sorted(ms)
        lines.append(f"  {profiler:<8} {variant:<20} median {statistics.median(d):7.1f}  p10 {d[len(d) // 10]:7.1f}"
                     f"  p90 {d[9 * len(d) // 10]:7.1f}  steps: " + " ".join(f"{m:.0f}" for m in ms))
    return lines


def trace_lines(files: dict[str, bytes]) -> list[str]:
    durs: dict[str, dict[str, list[float]]] = {}
    lines = []
    for v in ("none", "prismtrace"):
        events = json.loads(gzip.decompress(files[f"profile/{v}-torch-trace.json.gz"]))["traceEvents"]
        kernels = [e["dur"] for e in events if e.get("cat") == "kernel"]
        lines.append(f"  {v}: {len(kernels)} kernels, {sum(kernels) / 1000:.2f} ms of GPU kernel time in the 3 "
                     f"profiled steps")
        durs[v] = collections.defaultdict(list)
        for e in events:
            if e.get("cat") in ("cpu_op", "cuda_runtime"):
                durs[v][e["name"]].append(e["dur"])
    for op in OPS:
        a, b = durs["none"][op], durs["prismtrace"][op]
        lines.append(f"  {op:<22} calls {len(a)}/{len(b)}  median us none {statistics.median(a):7.2f}  prismtrace "
                     f"{statistics.median(b):7.2f}  ratio {statistics.median(b) / statistics.median(a):.2f}")
    return lines


def entry_lines(calls_tsv: bytes) -> list[str]:
    total, lines = 0.0, []
    for row in csv.DictReader(io.StringIO(calls_tsv.decode()), delimiter="\t"):
        if row["function"].startswith(ENTRY_POINTS):
            total += float(row["cumtime_us_per_step"])
            lines.append(f"  {row['function']:<45} {float(row['calls_per_step']):6.1f} calls/step "
                         f"{float(row['cumtime_us_per_step']):8.1f} us/step inclusive")
    return lines + [f"  the entry points together: {total / 1000:.2f} ms a step under cProfile"]


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0], "overhead_5rounds").is_dir():
        print("usage: overhead_levels.py S13_FOLDER [S12_FOLDER]  (S13_FOLDER holds overhead_5rounds/ and "
              "overhead_profile/: docs/results/frameworks/s13-h200)", file=sys.stderr)
        return 2
    s13 = Path(argv[0])
    out = ["== 1. the bench's rounds, each against its own none run"]
    for name in ("launch.txt", "larger.txt"):
        out += paired_lines(f"s13 call 5 {name}", round_medians((s13 / "overhead_5rounds" / name).read_text()))
    for i, meds in enumerate(one_round_tables((s13 / "overhead_profile" / "bench.txt").read_text())):
        out += paired_lines(f"s13 call 1 bench.txt table {i + 1} (reference, larger)", meds)
    if len(argv) > 1:  # session 12: one round each
        for i, meds in enumerate(one_round_tables((Path(argv[1]) / "overhead.txt").read_text())):
            out += paired_lines(f"s12 overhead.txt table {i + 1} (reference, larger)", meds)
    files = read_tgz(s13 / "overhead_profile" / "results.tgz")
    out += ["", "== 2. every run of overhead_profile (steps after its 3 warm-up steps, ms)"]
    out += step_lines(files["profile/steps.tsv"])
    out += ["", "== 3. the torch.profiler runs: GPU kernel time, and the same CPU ops' median durations"]
    out += trace_lines(files)
    out += ["", "== 4. PrismTrace's entry points under cProfile (inflated by cProfile's per-call cost)"]
    out += entry_lines(files["profile/prismtrace-prism-calls.tsv"])
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
