"""Samples what can make a pinned rank's core slower between runs, until it is stopped (SIGTERM) or DURATION_S:

    python3 scripts/host_sampler.py OUT.tsv CORES [INTERVAL_S] [DURATION_S]

Every INTERVAL_S (0.5) one row per core of CORES (comma-separated; their SMT siblings are added): the unix time,
the core, its clock (MHz: cpufreq's scaling_cur_freq, else /proc/cpuinfo's), and the share of the interval it
spent busy, in interrupts (irq + softirq), and stolen by a hypervisor (steal), from /proc/stat. A core whose
clock drops, or whose sibling is busy, or that loses time to steal while the rank runs, is a cause the bench's
per-run medians can then be joined with (session 13: a W=1 run ran at ~80 or ~125 ms a step whatever the variant).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path


def siblings(cores: list[int]) -> list[int]:
    """`cores` and their SMT siblings (the kernel's topology lists), sorted."""
    out = set(cores)
    for core in cores:
        path = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list")
        if path.is_file():
            for part in path.read_text().strip().split(","):
                lo, _, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def clocks() -> dict[int, float]:
    """Each core's current clock in MHz (cpufreq where the kernel has it, else /proc/cpuinfo's line)."""
    out: dict[int, float] = {}
    core = -1
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("processor"):
            core = int(line.split(":")[1])
        elif line.startswith("cpu MHz"):
            out[core] = float(line.split(":")[1])
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        out[int(path.parent.parent.name[3:])] = int(path.read_text()) / 1000
    return out


def jiffies() -> dict[int, list[int]]:
    """/proc/stat's per-core counters: user nice system idle iowait irq softirq steal ..."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *values = line.split()
            out[int(name[3:])] = [int(v) for v in values]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, cores = Path(argv[0]), siblings([int(c) for c in argv[1].split(",")])
    interval = float(argv[2]) if len(argv) > 2 else 0.5
    until = time.time() + (float(argv[3]) if len(argv) > 3 else 3600)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with out.open("w") as f:
        f.write("t\tcore\tmhz\tbusy\tirq\tsteal\n")
        before = jiffies()
        while not stop and time.time() < until:
            time.sleep(interval)
            now, mhz = jiffies(), clocks()
            t = time.time()
            for core in cores:
                d = [a - b for a, b in zip(now.get(core, []), before.get(core, []))]
                total = sum(d[:8]) or 1
                busy = total - d[3] - d[4] if len(d) > 4 else 0
                irq = d[5] + d[6] if len(d) > 6 else 0
                steal = d[7] if len(d) > 7 else 0
                f.write(f"{t:.2f}\t{core}\t{mhz.get(core, float('nan')):.0f}\t{busy / total:.3f}\t"
                        f"{irq / total:.3f}\t{steal / total:.3f}\n")
            f.flush()
            before = now
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
