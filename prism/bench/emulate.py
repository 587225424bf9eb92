"""`prism bench emulate`: hybrid emulation of one sandbox rank at W in {16, 64, 256, 1024} captured on P=2.

For each W: capture the reference workload (the layouts of `prism bench capture`) on P slots, build the
graph, calibrate (bare graph), then time ``prism emulate --sandbox SPEC --devices P``. Prints, per W:
start-up s (the launcher's, from ``emulation/meta.json``), peak memory of the whole emulation (summed
PSS of its process tree, sampled, as `prism bench capture` measures it), communicators created, wall time
per emulated iteration (the sandbox's measured iteration time, median over iterations >= 1) and the
emulation's wall time. Group reduction shows as start-up, memory and communicators flat in W.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.bench.capture_scale import LAYOUTS, TreeMemory, workload_args


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def prepare(w: int, devices: int, steps: int, work: Path) -> Path:
    """A captured, graphed and calibrated job of the reference workload at W."""
    job = work / f"w{w}"
    prism = [sys.executable, "-m", "prism.cli"]
    _run(prism + ["launch", "--nproc", str(w), "--mode", "capture", "--devices", str(devices), "--out", str(job)]
         + workload_args(w, steps), f"capture at W={w}")
    _run(prism + ["graph", "--job", str(job)], f"graph at W={w}")
    _run(prism + ["calibrate", "--job", str(job)], f"calibrate at W={w}")
    return job


def emulate_once(job: Path, sandbox: str | None, devices: int, extra: list[str] = ()) -> dict:
    """Time one ``prism emulate`` of `job`; returns the row of the table."""
    cmd = [sys.executable, "-m", "prism.cli", "emulate", "--job", str(job), "--devices", str(devices), "--force",
           *extra] + ([] if sandbox is None else ["--sandbox", sandbox])
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = TreeMemory(proc.pid, period=0.5)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"emulate of {job} failed ({proc.returncode}):\n{err[-3000:]}")
    meta = json.loads((job / "emulation" / "meta.json").read_text())
    stats = meta.get("emulation", {})
    it = pq.read_table(job / "emulation" / "iterations.parquet")
    sandbox_rows = it.filter(pc.equal(it["source"].cast("string"), "sandbox"))
    per_iter = [d for k, d in zip(sandbox_rows["iteration"].to_pylist(), sandbox_rows["duration_ns"].to_pylist())
                if k >= 1] or sandbox_rows["duration_ns"].to_pylist()
    return {
        "W": meta.get("world_size"), "sandbox": ",".join(map(str, meta.get("sandbox", []))), "wall_s": wall,
        "startup_s": stats.get("startup_s"), "pss_peak": sampler.peak, "communicators": stats.get("communicators"),
        "iteration_s": statistics.median(per_iter) / 1e9 if per_iter else None,
    }


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table(rows: list[dict], devices: int, steps: int) -> str:
    gib = 2**30
    lines = [f"prism bench emulate: one sandbox rank, P={devices}, {steps} steps, tiny MoE model",
             f"{'W':>5} {'layout':<18} {'sandbox':>7} {'start-up s':>10} {'PSS peak':>9} {'communicators':>13} "
             f"{'s/iteration':>11} {'wall s':>7}"]
    for r in rows:
        layout = "tp{}·pp{}·dp{}·ep{}".format(*LAYOUTS[r["W"]]) if r["W"] in LAYOUTS else "?"
        lines.append(f"{r['W']:>5} {layout:<18} {r['sandbox']:>7} {_fmt(r['startup_s'], '10.2f')} "
                     f"{r['pss_peak'] / gib:8.2f}G {_fmt(r['communicators'], '>13')} "
                     f"{_fmt(r['iteration_s'], '11.3f')} {r['wall_s']:7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench emulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated W values")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sandbox", help="SPEC (default: the stage's, one rank of the last pipeline stage)")
    parser.add_argument("--out", type=Path, help="folder for the jobs (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        print(f"prism bench emulate: --sizes {args.sizes!r}: comma-separated numbers", file=sys.stderr)
        return 2
    bad = [s for s in sizes if s not in LAYOUTS]
    if bad:
        print(f"prism bench emulate: no layout for W={bad}; choose from {sorted(LAYOUTS)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="prism-bench-emulate-"))
    rows = []
    try:
        for w in sizes:
            print(f"  W={w}: capture, graph, calibrate ...", file=sys.stderr, flush=True)
            job = prepare(w, args.devices, args.steps, work)
            print(f"  W={w}: emulate ...", file=sys.stderr, flush=True)
            rows.append(emulate_once(job, args.sandbox, args.devices))
    except RuntimeError as exc:
        print(f"prism bench emulate: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows, args.devices, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
