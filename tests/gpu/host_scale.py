"""Per-rank host memory and start time of capture with CUDA ranks on one GPU (issue 9 item 2; docs/gpu.md).

    python3 tests/gpu/host_scale.py --out DIR [--sizes 8,32,64] [--devices P]   # on a CUDA host

For each W, the tiny reference workload (`prism bench capture`'s layouts) is captured with `--device cuda`
(every rank initialises CUDA after the fork, on GPU 0) twice: 1 and 2 optimizer steps. Per W: the ranks'
private host memory (median and largest, each rank's /proc/self/smaps_rollup at its end: launcher
meta.json), the peak PSS of the whole process tree (sampled every 0.5 s), the wall time of each capture,
and the start-up estimate `2·wall(1 step) − wall(2 steps)` (the launch, the forks and every rank's CUDA
start, less one step's work: meaningful only on an otherwise idle host, where one step's time stands out of
the noise; beside other jobs quote wall(1 step)/W as the upper bound). Writes DIR/host_scale.json and prints
a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from prism.bench.sampled_run import run_sampled

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = {8: (2, 2, 2, 2), 32: (2, 2, 8, 4), 64: (2, 2, 16, 4)}  # W -> (tp, pp, dp, ep)
MIB = 2**20


def workload(w: int, steps: int, device: str) -> list[str]:
    tp, pp, dp, ep = LAYOUTS[w]
    return ["-m", "prism.workloads.moe_gpt", "--device", device, "--backend", "gloo", "--tp", str(tp),
            "--pp", str(pp), "--dp", str(dp), "--ep", str(ep), "--steps", str(steps), "--microbatches", str(pp),
            "--micro-batch-size", "1", "--seq-len", "16", "--hidden", "32", "--ffn-hidden", "32", "--heads", "2",
            "--kv-heads", "2", "--layers", str(pp), "--experts", str(ep), "--topk", "1", "--vocab", "64"]


def capture(w: int, steps: int, devices: int | None, job: Path, timeout: float, device: str) -> dict:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--out", str(job),
           "--force", "--no-payloads", *(["--devices", str(devices)] if devices else []), *workload(w, steps, device)]
    env = dict(os.environ, PRISM_DEVICE=device, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
               PYTHONUNBUFFERED="1")
    code, err, wall, peak, timed_out = run_sampled(cmd, timeout, cwd=REPO, env=env)
    if timed_out:
        raise RuntimeError(f"W={w} steps={steps}: capture ran past {timeout} s:\n{err[-2000:]}")
    if code != 0:
        raise RuntimeError(f"W={w} steps={steps}: capture failed ({code}):\n{err[-3000:]}")
    meta = json.loads((job / "raw" / "meta.json").read_text())
    cap = meta["capture"]
    return {"wall_s": wall, "pss_peak_mib": peak / MIB, "rank_private_mib_median": cap["rank_private_mib_median"],
            "rank_private_mib_max": cap["rank_private_mib_max"], "switches": cap.get("context_switches"),
            "device": meta.get("device")}


def run(sizes: list[int], devices: int | None, timeout: float, device: str = "cuda", log=print) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="prism-hostscale-") as work:
        for w in sizes:
            one = capture(w, 1, devices, Path(work) / f"w{w}-1", timeout, device)
            two = capture(w, 2, devices, Path(work) / f"w{w}-2", timeout, device)
            row = {"W": w, "layout": "tp{}·pp{}·dp{}·ep{}".format(*LAYOUTS[w]), "P": devices,
                   "wall_1step_s": one["wall_s"], "wall_2steps_s": two["wall_s"],
                   "startup_s": 2 * one["wall_s"] - two["wall_s"], "per_rank_startup_s":
                   (2 * one["wall_s"] - two["wall_s"]) / w, "rank_private_mib_median": two["rank_private_mib_median"],
                   "rank_private_mib_max": two["rank_private_mib_max"], "tree_pss_peak_mib": two["pss_peak_mib"],
                   "device": two["device"]}
            rows.append(row)
            log(json.dumps(row))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| W | layout | wall 1 step s | wall 2 steps s | start-up s (2·w1 − w2) | per rank s | rank private "
             "MiB median / max | tree PSS peak MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['W']} | {r['layout']} | {r['wall_1step_s']:.1f} | {r['wall_2steps_s']:.1f} | "
                     f"{r['startup_s']:.1f} | {r['per_rank_startup_s']:.2f} | {r['rank_private_mib_median']:.1f} / "
                     f"{r['rank_private_mib_max']:.1f} | {r['tree_pss_peak_mib']:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sizes", default="8,32,64")
    p.add_argument("--devices", type=int, default=None, help="capture slots P (default: the launcher's)")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--device", default="cuda", help="the ranks' device (cpu: a local check of this script)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for w in [int(s) for s in a.sizes.split(",")]:
            rows += run([w], a.devices, a.timeout, a.device, log=lambda m: print(m, flush=True))
    finally:
        (a.out / "host_scale.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
