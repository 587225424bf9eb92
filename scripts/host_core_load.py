"""How fast one core computes the bench's model step while other cores are busy with the same step
(issue 24: does a slice rank, 4 busy cores of a stream's 8, compute faster than a truth rank, 8 busy?).

    python3 scripts/host_core_load.py OUT.jsonl [--measure 1.2] [--rounds 3] [--pairs]
    python3 scripts/host_core_load.py --summarize OUT.jsonl        (the table again, from the saved file)

One worker process per core of the affinity, each pinned to its core with one torch thread, runs the reference
workload (`prism.workloads.moe_gpt` with the fidelity bench's MODEL, no torch.distributed) step after step while
its core is switched on, and idles (1 ms sleeps) while it is off. The controller switches sets of cores on
("arms"), lets them settle 0.4 s, and measures `--measure` s; every worker stamps each step (CLOCK_MONOTONIC
start, wall, thread CPU time). Arms: each core alone; every other core's load against core 0 (`--pairs`: an SMT
sibling the VM does not show, or a shared cache, shows as a slower core 0); k busy cores of one half (2, 4, 8);
one half against the other; all cores. The arms' order is reversed every other round. Per arm, /proc/stat's
steal and the cores' clocks (/proc/cpuinfo) are read at its start and end.

Writes one JSON line per arm (name, busy cores, round, start/end, steal per core) and one per worker with its
steps, then prints per arm: the median step CPU time of core 0 and of the busy cores, relative to core 0 alone
in the same round.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

MODEL = ["--hidden", "128", "--ffn-hidden", "256", "--seq-len", "64", "--layers", "4", "--heads", "4",
         "--kv-heads", "2", "--experts", "4", "--micro-batch-size", "2", "--device", "cpu"]


def worker(core: int, on, stop, conn) -> None:
    os.sched_setaffinity(0, {core})
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.stdout = open(os.devnull, "w")   # the workload's loss lines
    sys.stderr = open(os.devnull, "w")
    import torch
    torch.set_num_threads(1)
    from prism.workloads import moe_gpt
    steps = []
    last = [time.monotonic(), time.thread_time()]

    def between(_k: int) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        if on[core]:
            steps.append((last[0], now - last[0], cpu - last[1]))
        if stop.value:
            conn.send(steps)
            conn.close()
            os._exit(0)
        while not on[core] and not stop.value:
            time.sleep(0.001)
        last[0], last[1] = time.monotonic(), time.thread_time()
        if stop.value:
            between(_k)

    moe_gpt.main(MODEL + ["--steps", "100000000"], between_steps=between)


def proc_stat() -> dict[int, list[int]]:
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *vals = line.split()
            out[int(name[3:])] = [int(v) for v in vals]
    return out


def clocks() -> list[float]:
    return [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")]


def arms_for(cores: list[int], first_round: bool, pairs: bool) -> list[tuple[str, list[int]]]:
    """Round 0: every core alone (and with `pairs` every other core's load against core 0); every round: core 0
    and the first core of the other half alone, k busy cores of one half, halves against each other."""
    c0, n = cores[0], len(cores)
    half = cores[: n // 2] if n >= 4 else cores
    other = cores[n // 2:] if n >= 4 else []
    alone = cores if first_round else [c0] + other[:1]
    arms = [(f"alone {c}", [c]) for c in alone]
    if pairs and first_round:
        arms += [(f"0+{c}", [c0, c]) for c in cores[1:]]
    for k in (2, 4, 8):
        if k <= len(half):
            arms.append((f"half x{k}", half[:k]))
    if other:
        arms += [("half x4 + other half", half[:4] + other), ("half + other half (all)", cores),
                 ("0 + other half", [c0] + other)]
    return arms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--summarize", action="store_true", help="run nothing: the table of a saved OUT.jsonl")
    ap.add_argument("--measure", type=float, default=1.2)
    ap.add_argument("--settle", type=float, default=0.4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", action="store_true", help="every core's load against core 0 (first round only)")
    a = ap.parse_args()
    if a.summarize:
        lines = [json.loads(line) for line in a.out.read_text().splitlines()]
        steps = {r["core"]: r["steps"] for r in lines if "core" in r}
        print(summarize([r for r in lines if "arm" in r], steps, sorted(steps)))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("spawn")
    on = ctx.Array("b", max(cores) + 1, lock=False)
    stop = ctx.Value("b", 0, lock=False)
    procs, conns = {}, {}
    for c in cores:
        parent, child = ctx.Pipe(duplex=False)
        procs[c] = ctx.Process(target=worker, args=(c, on, stop, child), daemon=True)
        procs[c].start()
        conns[c] = parent
    # warm every worker: all on for a while (import, model build, the first steps' lazy work)
    for c in cores:
        on[c] = 1
    time.sleep(8.0)
    for c in cores:
        on[c] = 0
    time.sleep(0.5)
    records = []
    for rnd in range(a.rounds):
        arms = arms_for(cores, rnd == 0, a.pairs)
        if rnd % 2:
            arms = arms[::-1]
        for name, busy in arms:
            for c in busy:
                on[c] = 1
            time.sleep(a.settle)
            st0, mhz0, t0 = proc_stat(), clocks(), time.monotonic()
            time.sleep(a.measure)
            t1, st1, mhz1 = time.monotonic(), proc_stat(), clocks()
            for c in busy:
                on[c] = 0
            steal = {c: st1[c][7] - st0[c][7] for c in cores if c in st0 and len(st0[c]) > 7}
            records.append({"arm": name, "busy": busy, "round": rnd, "t0": t0, "t1": t1, "steal_ticks": steal,
                            "mhz": [statistics.median(mhz0 or [0]), statistics.median(mhz1 or [0])]})
            time.sleep(0.15)
    stop.value = 1
    steps = {}
    for c in cores:
        try:
            steps[c] = conns[c].recv() if conns[c].poll(30) else []
        except EOFError:
            steps[c] = []
        procs[c].join(5)
        if procs[c].is_alive():
            procs[c].kill()
    with a.out.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for c in cores:
            f.write(json.dumps({"core": c, "steps": steps[c]}) + "\n")
    print(summarize(records, steps, cores))
    return 0


def step_stats(steps: list, t0: float, t1: float) -> tuple[int, float, float]:
    inside = [s for s in steps if s[0] >= t0 and s[0] + s[1] <= t1]
    if not inside:
        return 0, float("nan"), float("nan")
    return len(inside), statistics.median(s[2] for s in inside) * 1e3, statistics.median(s[1] for s in inside) * 1e3


def summarize(records: list[dict], steps: dict[int, list], cores: list[int]) -> str:
    c0 = cores[0]
    lines = ["| round | arm | busy | core 0 steps | core 0 CPU ms (wall) | vs alone | busy cores' CPU ms: median (min-max) | steal ticks |",
             "|---|---|---|---|---|---|---|---|"]
    alone = {}
    for r in records:
        if r["arm"] == f"alone {c0}":
            alone[r["round"]] = step_stats(steps[c0], r["t0"], r["t1"])[1]
    for r in records:
        n0, cpu0, wall0 = step_stats(steps[c0], r["t0"], r["t1"]) if c0 in r["busy"] else (0, float("nan"), float("nan"))
        per = [step_stats(steps[c], r["t0"], r["t1"])[1] for c in r["busy"]]
        per = [p for p in per if p == p]
        base = alone.get(r["round"], float("nan"))
        rel = f"{cpu0 / base:.3f}" if cpu0 == cpu0 and base == base else "-"
        spread = (f"{statistics.median(per):.2f} ({min(per):.2f}-{max(per):.2f})" if per else "-")
        busy = r["busy"]
        busy_s = ",".join(map(str, busy)) if len(busy) <= 4 else f"{len(busy)} cores"
        lines.append(f"| {r['round']} | {r['arm']} | {busy_s} | {n0} | {cpu0:.2f} ({wall0:.2f}) | {rel} | {spread} | "
                     f"{sum(r['steal_ticks'].values())} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
