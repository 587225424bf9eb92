"""Where a weak-layout capture's wall goes as W grows (issue 25 item 3): one capture per W of the reference
workload on the weak layout tp2·pp2·dp(W/4)·ep2 (`scale_slices.WEAK`, as `prism bench capture --weak` runs it:
2 steps, payloads on, the warm-up in the zygote), then its phases from `raw/meta.json` (`capture.phases_s`: the
zygote's warm-up and forks, the ranks' set-up until every rank first blocked, the steps until the last exit, the
close) and the launcher's rest (its own start and publishing: the wall less those), with the growth exponent k of
each phase (wall ∝ W^k, least squares through every W) and its value extrapolated to `--predict` W.

    .venv/bin/python scripts/capture_phases.py --sizes 64,128,256,512 --devices 2 --out DIR [--predict 8192]

Writes DIR/phases.tsv (one row a W) and prints the table and the fit. A capture that fails stops the script
(exit 1, its log's tail printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prism.bench.capture_scale import WARMUP, layout_args, layout_name
from prism.bench.scale_slices import WEAK

PHASES = ("warm", "fork", "setup", "steps", "close", "launcher")
COLUMNS = ("W", "layout", "wall_s", "queued_s", *(f"{p}_s" for p in PHASES), "exits_s", "hello_s", "setup_cpu_s",
           "rank_cpu_s",
           "rank_process_cpu_s", "slot_held_s", "logical_s_median",
           "coordinator_cpu_s", "messages", "completed_comms", "rank_private_mib_median", "load1_before",
           "load1_after")


def capture(w: int, devices: int, steps: int, work: Path, extra_env: dict) -> dict:
    job = work / f"w{w}"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job), "--force", "--progress", "--preload", WARMUP] + layout_args(*WEAK[w], steps)
    load = os.getloadavg()[0]
    began = time.monotonic()
    with open(work / f"w{w}-capture.log", "w") as log:
        code = subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **extra_env})
    wall = time.monotonic() - began
    if code != 0:
        tail = (work / f"w{w}-capture.log").read_text()[-2000:]
        raise SystemExit(f"capture of W={w} failed (exit {code}):\n{tail}")
    meta = json.loads((job / "raw" / "meta.json").read_text())
    cap = meta["capture"]
    ph = cap["phases_s"]
    # meta's wall: from the zygote's start to the publishing (not the launcher's wait for free cores: this box's
    # other runs claim them too, and a launch waits for them; that wait, and the launcher's imports, are `queued`)
    row = {"W": w, "layout": layout_name(WEAK[w]), "wall_s": round(meta["wall_s"], 2),
           "queued_s": round(wall - meta["wall_s"], 2),
           **{f"{p}_s": ph.get(p) for p in PHASES if p != "launcher"}, "exits_s": ph.get("exits"),
           "hello_s": ph.get("hello"),
           "setup_cpu_s": cap.get("setup_cpu_s"), "slot_held_s": cap.get("slot_held_s"),
           "logical_s_median": cap.get("logical_s_median"),
           "coordinator_cpu_s": cap.get("coordinator_cpu_s"), "messages": cap.get("messages"),
           "completed_comms": cap.get("completed_comms"), "rank_private_mib_median": cap.get("rank_private_mib_median"),
           "load1_before": round(load, 2), "load1_after": round(os.getloadavg()[0], 2)}
    inside = sum(ph.get(p) or 0.0 for p in ("warm", "fork", "setup", "steps", "close"))
    row["launcher_s"] = round(meta["wall_s"] - inside, 3)  # the zygote's interpreter start, the publishing
    # every rank's CPU (its thread clock at its end): with setup_cpu_s, what the slots had to run
    stats = [json.loads(p.read_text()) for p in (job / "raw").glob("rank=*/capture_stats.json")]
    row["rank_cpu_s"] = round(sum(s["logical_ns"] for s in stats) / 1e9, 3)
    row["rank_process_cpu_s"] = round(sum(s.get("process_cpu_ns", 0) for s in stats) / 1e9, 3)
    (work / f"w{w}-meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(job, ignore_errors=True)
    return row


def fit(rows: list[dict], column: str) -> tuple[float, float] | None:
    """(k, a) of value = a·W^k, least squares in log-log through the rows with a positive value."""
    pts = [(math.log(r["W"]), math.log(r[column])) for r in rows if (r.get(column) or 0) > 0]
    if len(pts) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    k = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return k, math.exp(my - k * mx)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,128,256,512")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--predict", type=int, default=8192)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the captures (repeatable)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bad = [w for w in sizes if w not in WEAK]
    if bad:
        parser.error(f"no weak layout for W={bad}; choose from {sorted(WEAK)}")
    extra = dict(e.split("=", 1) for e in args.env)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    table = args.out / "phases.tsv"
    for w in sizes:
        rows.append(capture(w, args.devices, args.steps, args.out, extra))
        with open(table, "w") as f:
            f.write("\t".join(COLUMNS) + "\n")
            for r in rows:
                f.write("\t".join("" if r.get(c) is None else str(r[c]) for c in COLUMNS) + "\n")
        print("\t".join(f"{c}={rows[-1].get(c)}" for c in COLUMNS), flush=True)
    print(f"\nfit value = a·W^k through W={','.join(map(str, sizes))}; at W={args.predict} on {args.devices} slots:")
    for col in ("wall_s", *(f"{p}_s" for p in PHASES), "setup_cpu_s", "rank_cpu_s", "coordinator_cpu_s"):
        f_ = fit(rows, col)
        if f_ is not None:
            k, a = f_
            print(f"  {col:<18} k={k:5.2f}  predicted {a * args.predict ** k:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
