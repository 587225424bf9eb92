"""Events a rank records for candidate layouts of the reference workload (issue 12 item 3: which W=8192 layout's
capture fits the time of one device call): each layout TP,PP,DP,EP is captured at a small DP (payloads off,
P slots), its graph built, and the events per rank printed. What a rank records depends on TP, PP (layers and
microbatches) and EP, hardly on DP, so the events of the full-size job are about events/rank x W.

    .venv/bin/python scripts/layout_events.py 8,8,2,2 4,8,2,2 8,4,2,2 [--devices 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prism.bench.capture_scale import WARMUP, layout_args


def count(layout: tuple[int, int, int, int], devices: int, steps: int, work: Path) -> dict:
    tp, pp, dp, ep = layout
    w = tp * pp * dp
    job = work / "job-{}-{}-{}-{}".format(*layout)
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job), "--force", "--no-payloads", "--preload", WARMUP] + layout_args(*layout, steps)
    began = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"capture of tp{tp}·pp{pp}·dp{dp}·ep{ep} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    graph = subprocess.run([sys.executable, "-m", "prism.cli", "graph", "--job", str(job)], capture_output=True, text=True)
    if graph.returncode != 0:
        raise SystemExit(f"graph of tp{tp}·pp{pp}·dp{dp}·ep{ep} failed:\n{graph.stderr[-2000:]}")
    import pyarrow.parquet as pq

    events = pq.ParquetFile(job / "graph" / "events.parquet").metadata.num_rows
    cap = json.loads((job / "raw" / "meta.json").read_text())["capture"]
    return {"layout": f"tp{tp}·pp{pp}·dp{dp}·ep{ep}", "W": w, "events": events, "per_rank": events / w, "wall_s": wall,
            "ranks_cpu_s": cap["logical_s_median"] * w}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layouts", nargs="+", help="TP,PP,DP,EP")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prism-layout-events-") as tmp:
        print(f"{'layout':<20} {'W':>5} {'events':>9} {'events/rank':>12} {'capture s':>10} {'ranks CPU s':>12}")
        for text in args.layouts:
            layout = tuple(int(x) for x in text.split(","))
            row = count(layout, args.devices, args.steps, Path(tmp))
            print(f"{row['layout']:<20} {row['W']:>5} {row['events']:>9,} {row['per_rank']:>12.1f} {row['wall_s']:>10.1f} "
                  f"{row['ranks_cpu_s']:>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
