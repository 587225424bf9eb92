"""`prism bench capture`: capture of the reference workload at W ranks on P slots, and (`--pipeline`) the
stages after it: graph, slice plan (`--representative`), calibration.

Prints, per W: wall time, peak memory of the whole process tree (sum of the processes' PSS, sampled;
and the memory cgroup's peak where this machine lets us make one, which also counts /dev/shm and the
page cache of what was written), the ranks' private memory (median and largest, each rank's own
/proc/self/smaps_rollup at its end), context switches, events per second, graph bytes, payload bytes.
With `--pipeline`, per stage: wall, peak memory (capture: the tree's PSS; the others: the process's max
RSS), events/s, artifact bytes. `--budget S` skips a size whose capture, extrapolated linearly from the
previous size's, would not end within S seconds of the start (said so in the table, never silently);
`--json FILE` writes every row. The model is tiny: capture cost is about ranks and communication, not FLOPs.
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
    2048: (4, 4, 128, 8),
    4096: (4, 8, 128, 8),
    8192: (8, 8, 128, 8),
}
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
WARMUP = "prism.workloads.moe_gpt"  # preloaded: its `prism_warmup` runs once in the zygote


def workload_args(w: int, steps: int) -> list[str]:
    tp, pp, dp, ep = LAYOUTS[w]
    heads = max(2, tp)  # divisible by tp; hidden 32 / heads stays an even head size up to tp 8
    return ["-m", "prism.workloads.moe_gpt", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--ep", str(ep),
            "--steps", str(steps), "--microbatches", str(pp), "--micro-batch-size", "1", "--seq-len", "16",
            "--hidden", "32", "--ffn-hidden", "32", "--heads", str(heads), "--kv-heads", str(heads),
            "--layers", str(pp), "--experts", str(ep), "--topk", "1", "--vocab", "64"]


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


def _stage(cmd: list[str], what: str) -> tuple[float, int]:
    """Run one stage to its end: (wall seconds, the stage process's own max RSS in bytes, from wait4)."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{what} failed ({proc.returncode}):\n{err.read()[-2000:]}")
    return wall, usage.ru_maxrss * 1024


def run_one(w: int, devices: int, steps: int, payloads: bool, work: Path, pipeline: bool = False,
            warmup: bool = True, timeout: float | None = None) -> dict:
    job = work / f"w{w}"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job), "--force", "--progress"] + ([] if payloads else ["--no-payloads"]) \
        + (["--preload", WARMUP] if warmup else []) + workload_args(w, steps)
    cg = _cgroup()
    start = time.monotonic()
    log = open(work / f"w{w}-capture.log", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    if cg is not None:
        (cg / "cgroup.procs").write_text(str(proc.pid))
    sampler = TreeMemory(proc.pid, period=1.0 if w <= 256 else 3.0 if w <= 1024 else 10.0)
    sampler.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher stops the ranks and removes its temporaries
        proc.wait()
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    log.close()
    cg_peak = None
    if cg is not None:
        cg_peak = int((cg / "memory.max_usage_in_bytes").read_text())
        try:
            cg.rmdir()
        except OSError:
            pass
    if proc.returncode != 0:
        err = (work / f"w{w}-capture.log").read_text()
        raise RuntimeError(f"capture at W={w} failed ({proc.returncode}) after {wall:.0f} s:\n{err[-3000:]}")
    graph_s, graph_rss = _stage([sys.executable, "-m", "prism.cli", "graph", "--job", str(job)], f"graph at W={w}")
    meta = json.loads((job / "raw" / "meta.json").read_text())
    import pyarrow.parquet as pq

    events = pq.ParquetFile(job / "graph" / "events.parquet").metadata.num_rows
    cap = meta["capture"]
    row = {
        "W": w, "P": devices, "layout": "tp{}·pp{}·dp{}·ep{}".format(*LAYOUTS[w]), "wall_s": wall,
        "pss_peak": sampler.peak, "cgroup_peak": cg_peak, "switches": cap["context_switches"], "events": events,
        "events_per_s": events / wall, "raw_bytes": _folder_bytes(job / "raw"),
        "graph_bytes": _folder_bytes(job / "graph"), "payload_bytes": _folder_bytes(job / "payloads"),
        "payload_files": len(list((job / "payloads").rglob("*.bin"))) if payloads else 0,
        "rank_private_mib_median": cap.get("rank_private_mib_median"),
        "rank_private_mib_max": cap.get("rank_private_mib_max"), "messages": cap.get("messages"),
        "warmup": warmup, "graph_s": graph_s, "graph_rss": graph_rss,
    }
    if pipeline:
        row["plan_s"], row["plan_rss"] = _stage([sys.executable, "-m", "prism.slices.plan", "--job", str(job),
                                                 "--devices", str(devices), "--representative"], f"plan at W={w}")
        row["slices_bytes"] = _folder_bytes(job / "slices")
        row["calibrate_s"], row["calibrate_rss"] = _stage(
            [sys.executable, "-m", "prism.cli", "calibrate", "--job", str(job)], f"calibrate at W={w}")
        row["calibrated_bytes"] = _folder_bytes(job / "calibrated")
    shutil.rmtree(job, ignore_errors=True)
    return row


def print_table(rows: list[dict], args) -> None:
    gib, mib = 2 ** 30, 2 ** 20
    print(f"\nprism bench capture: P={args.devices}, {args.steps} steps, tiny MoE model, payloads "
          f"{'off' if args.no_payloads else 'on'}, workload warm-up {'off' if args.no_warmup else 'on'}")
    print(f"{'W':>5} {'layout':<18} {'wall s':>7} {'PSS peak':>9} {'cgroup peak':>12} {'rank MiB med/max':>17} "
          f"{'switches':>9} {'events':>10} {'events/s':>9} {'graph MiB':>9} {'payload MiB':>11} {'payload files':>13}")
    for r in rows:
        if r.get("skipped"):
            print(f"{r['W']:>5} skipped: {r['skipped']}")
            continue
        cg = f"{r['cgroup_peak'] / gib:10.2f}Gi" if r["cgroup_peak"] else f"{'n/a':>12}"
        priv = f"{r['rank_private_mib_median'] or 0:.1f}/{r['rank_private_mib_max'] or 0:.1f}"
        print(f"{r['W']:>5} {r['layout']:<18} {r['wall_s']:7.1f} {r['pss_peak'] / gib:8.2f}G {cg} {priv:>17} "
              f"{r['switches']:>9,} {r['events']:>10,} {r['events_per_s']:>9,.0f} "
              f"{r['graph_bytes'] / mib:9.2f} {r['payload_bytes'] / mib:11.1f} {r['payload_files']:>13,}")
    staged = [r for r in rows if "plan_s" in r]
    if staged:
        print(f"\nper stage: wall s / peak memory GiB (capture: tree PSS; others: max RSS) / events/s / artifact MiB")
        print(f"{'W':>5} {'events':>10} {'capture':>28} {'graph':>28} {'plan --representative':>28} "
              f"{'calibrate':>28}")
        for r in staged:
            cells = [(r["wall_s"], r["pss_peak"], r["raw_bytes"] + r["payload_bytes"]),
                     (r["graph_s"], r["graph_rss"], r["graph_bytes"]), (r["plan_s"], r["plan_rss"], r["slices_bytes"]),
                     (r["calibrate_s"], r["calibrate_rss"], r["calibrated_bytes"])]
            text = [f"{s:6.1f}/{m / gib:5.2f}/{r['events'] / s:9,.0f}/{b / mib:6.1f}" for s, m, b in cells]
            print(f"{r['W']:>5} {r['events']:>10,} " + " ".join(f"{t:>28}" for t in text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated W values, run in this order")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-payloads", action="store_true")
    parser.add_argument("--no-warmup", action="store_true", help="no workload warm-up in the zygote")
    parser.add_argument("--pipeline", action="store_true", help="also time the slice plan and calibration")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: skip a size whose extrapolated capture would not end in time")
    parser.add_argument("--json", type=Path, help="write the rows to this file (after each size)")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    bad = [s for s in sizes if s not in LAYOUTS]
    if bad:
        print(f"prism bench capture: no layout for W={bad}; choose from {sorted(LAYOUTS)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="prism-bench-capture-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    began = time.monotonic()
    for w in sizes:
        done = [r for r in rows if not r.get("skipped")]
        left = None if args.budget is None else args.budget - (time.monotonic() - began)
        if left is not None and done:
            last = done[-1]
            per_rank = (last["wall_s"] + last["graph_s"] + last.get("plan_s", 0) + last.get("calibrate_s", 0)) \
                / last["W"]
            guess = per_rank * w
            if guess > left:
                rows.append({"W": w, "skipped": f"extrapolated {guess:.0f} s (from W={last['W']}) > {left:.0f} s "
                                                 "left of the budget"})
                print(f"  W={w}: {rows[-1]['skipped']}", file=sys.stderr, flush=True)
                continue
        print(f"  W={w} ...", file=sys.stderr, flush=True)
        try:
            rows.append(run_one(w, args.devices, args.steps, not args.no_payloads, work, args.pipeline,
                                not args.no_warmup, timeout=left))
        except RuntimeError as exc:
            lines = [l for l in str(exc).splitlines() if l.strip()]
            rows.append({"W": w, "skipped": " ".join(dict.fromkeys([lines[0], lines[-1]]))})
            print(f"  W={w}: {exc}", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
        print_table(rows, args)
    if rows and rows[-1].get("skipped"):
        print_table(rows, args)
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if any(not r.get("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
