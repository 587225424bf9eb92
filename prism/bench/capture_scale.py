"""`prism bench capture`: capture of the reference workload at W in {16, 64, 256, 1024} on P=2 slots.

Prints, per W: wall time, peak memory of the whole process tree (sum of the processes' PSS, sampled;
and the memory cgroup's peak where this machine lets us make one, which also counts /dev/shm and the
page cache of what was written), context switches, events per second, graph bytes, payload bytes.
The model is tiny: capture cost is about ranks and communication, not FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LAYOUTS = {  # W -> (tp, pp, dp, ep)
    16: (2, 2, 4, 2),
    64: (2, 2, 16, 4),
    256: (2, 4, 32, 4),
    1024: (2, 4, 128, 8),
}
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def workload_args(w: int, steps: int) -> list[str]:
    tp, pp, dp, ep = LAYOUTS[w]
    return ["-m", "prism.workloads.moe_gpt", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--ep", str(ep),
            "--steps", str(steps), "--microbatches", str(pp), "--micro-batch-size", "1", "--seq-len", "16",
            "--hidden", "32", "--ffn-hidden", "32", "--heads", "2", "--kv-heads", "2", "--layers", str(pp),
            "--experts", str(ep), "--topk", "1", "--vocab", "64"]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the summed PSS of a process tree; `peak` is the largest sample."""

    def __init__(self, root: int, period: float) -> None:
        super().__init__(daemon=True)
        self.root, self.period, self.peak, self.samples = root, period, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, sum(_pss(p) for p in _descendants(self.root)))
            self.samples += 1
            self.stop.wait(self.period)


def _cgroup() -> Path | None:
    """A fresh memory cgroup (v1) under ours, if this machine allows it."""
    try:
        mine = next(l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if ":memory:" in l)
        path = CGROUP_V1 / mine.lstrip("/") / f"prism-bench-{os.getpid()}"
        path.mkdir()
        return path
    except (OSError, StopIteration):
        return None


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run_one(w: int, devices: int, steps: int, payloads: bool, work: Path) -> dict:
    job = work / f"w{w}"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job)] + ([] if payloads else ["--no-payloads"]) + workload_args(w, steps)
    cg = _cgroup()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if cg is not None:
        (cg / "cgroup.procs").write_text(str(proc.pid))
    sampler = TreeMemory(proc.pid, period=1.0 if w <= 256 else 3.0)
    sampler.start()
    _, err = proc.communicate()
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    cg_peak = None
    if cg is not None:
        cg_peak = int((cg / "memory.max_usage_in_bytes").read_text())
        try:
            cg.rmdir()
        except OSError:
            pass
    if proc.returncode != 0:
        raise RuntimeError(f"capture at W={w} failed ({proc.returncode}):\n{err[-3000:]}")
    graph = subprocess.run([sys.executable, "-m", "prism.cli", "graph", "--job", str(job)],
                           capture_output=True, text=True)
    if graph.returncode != 0:
        raise RuntimeError(f"graph at W={w} failed:\n{graph.stderr[-2000:]}")
    meta = json.loads((job / "raw" / "meta.json").read_text())
    import pyarrow.parquet as pq

    events = pq.ParquetFile(job / "graph" / "events.parquet").metadata.num_rows
    row = {
        "W": w, "layout": "tp{}·pp{}·dp{}·ep{}".format(*LAYOUTS[w]), "wall_s": wall, "pss_peak": sampler.peak,
        "cgroup_peak": cg_peak, "switches": meta["capture"]["context_switches"], "events": events,
        "events_per_s": events / wall, "raw_bytes": _folder_bytes(job / "raw"),
        "graph_bytes": _folder_bytes(job / "graph"), "payload_bytes": _folder_bytes(job / "payloads"),
        "payload_files": len(list((job / "payloads").rglob("*.bin"))) if payloads else 0,
    }
    shutil.rmtree(job, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated W values")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-payloads", action="store_true")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    bad = [s for s in sizes if s not in LAYOUTS]
    if bad:
        print(f"prism bench capture: no layout for W={bad}; choose from {sorted(LAYOUTS)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="prism-bench-capture-"))
    rows = []
    for w in sizes:
        print(f"  W={w} ...", file=sys.stderr, flush=True)
        rows.append(run_one(w, args.devices, args.steps, not args.no_payloads, work))
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    gib = 2 ** 30
    print(f"\nprism bench capture: P={args.devices}, {args.steps} steps, tiny MoE model, payloads "
          f"{'off' if args.no_payloads else 'on'}")
    print(f"{'W':>5} {'layout':<18} {'wall s':>7} {'PSS peak':>9} {'cgroup peak':>12} {'switches':>9} "
          f"{'events':>8} {'events/s':>9} {'graph MiB':>9} {'payload MiB':>11} {'payload files':>13}")
    for r in rows:
        cg = f"{r['cgroup_peak'] / gib:10.2f}Gi" if r["cgroup_peak"] else f"{'n/a':>12}"
        print(f"{r['W']:>5} {r['layout']:<18} {r['wall_s']:7.1f} {r['pss_peak'] / gib:8.2f}G {cg} "
              f"{r['switches']:>9,} {r['events']:>8,} {r['events_per_s']:>9,.0f} "
              f"{r['graph_bytes'] / 2**20:9.2f} {r['payload_bytes'] / 2**20:11.1f} {r['payload_files']:>13,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
