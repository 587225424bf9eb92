"""Where a capture rank's private memory is (issue 12 item 1): capture the reference workload at W on P slots
with PRISM_MEMORY_PROFILE set, so that every rank, at its end, writes its private bytes by mapping kind and
(run as root: the pagemap is readable) how many of them are copies of the zygote's pages (written by the
rank: reference counts, the interpreter's inline caches, malloc reusing the zygote's free chunks) and how
many are new. Prints the mean per rank.

    .venv/bin/python scripts/rank_memory.py --sizes 16 [--devices 2] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from prism.bench.capture_scale import WARMUP, workload_args


def profile(w: int, devices: int, steps: int, work: Path) -> dict:
    folder = work / f"profile-w{w}"
    folder.mkdir(parents=True)
    job = work / f"w{w}"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job), "--force", "--preload", WARMUP] + workload_args(w, steps)
    env = dict(__import__("os").environ, PRISM_MEMORY_PROFILE=str(folder))
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"capture at W={w} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    ranks = [json.loads(p.read_text()) for p in folder.glob("rank=*.json")]
    kinds: dict[str, dict[str, float]] = {}
    objects: dict[str, float] = {}
    for r in ranks:
        for name, value in r.pop("objects", {}).items():
            objects[name] = objects.get(name, 0.0) + value / len(ranks) / 2**20
        for kind, row in r.items():
            for key, value in row.items():
                kinds.setdefault(kind, {}).setdefault(key, 0.0)
                kinds[kind][key] += value / len(ranks) / 2**20
    cap = json.loads((job / "raw" / "meta.json").read_text())["capture"]
    return {"W": w, "ranks": len(ranks), "kinds": kinds, "median": cap.get("rank_private_mib_median"),
            "max": cap.get("rank_private_mib_max"), "zygote": cap.get("immortal"),
            "objects": dict(sorted(objects.items(), key=lambda kv: -kv[1]))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=15, help="object types to print")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prism-rank-memory-") as tmp:
        for w in (int(s) for s in args.sizes.split(",")):
            row = profile(w, args.devices, args.steps, Path(tmp))
            print(f"W={w}: {row['ranks']} ranks, private MiB a rank at its end median {row['median']:.2f}, "
                  f"max {row['max']:.2f}; mean per rank by mapping (MiB):")
            print(f"  {'mapping':<8} {'private':>8} {'copied':>8} {'new':>8}")
            for kind, v in sorted(row["kinds"].items(), key=lambda kv: -kv[1].get("private", 0)):
                if v.get("private", 0) >= 0.005:
                    print(f"  {kind:<8} {v.get('private', 0):8.2f} {v.get('copied', 0):8.2f} {v.get('new', 0):8.2f}")
            total = {k: sum(v.get(k, 0) for v in row["kinds"].values()) for k in ("private", "copied", "new")}
            print(f"  {'all':<8} {total['private']:8.2f} {total['copied']:8.2f} {total['new']:8.2f}")
            print(f"  the zygote's immortal objects: {row['zygote']}")
            print("  the copied pages by the type of the objects on them (a page with several types counts for "
                  "each), mean MiB a rank:")
            for name, mib in list(row["objects"].items())[:args.top]:
                print(f"    {name:<24} {mib:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
