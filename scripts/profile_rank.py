"""cProfile of chosen ranks of a capture (or any `prism launch` run), by their own CPU time (thread clock: the
time a rank waits for a slot or a collective is not counted): run as the launched program, it runs MODULE as
`-m MODULE ARGS` would, profiling ranks RANKS, and writes OUT/rank=R.prof (pstats) and OUT/rank=R.txt (the top
functions by own and by cumulative time). RANKS `times`: no profile, every rank's thread CPU (ns) as the module
starts and ends, appended to OUT/times.tsv (rank, start, end: what the rank ran before and inside the program; its
capture_stats.json's logical_ns is its end). PROFILE_CLOCK=wall profiles by the wall clock instead (the waits then
count: for a slot, in `CaptureClient._await_go`; anything else a rank sleeps in shows up too).

    prism launch --nproc 256 --mode capture --devices 2 --out JOB --preload prism.workloads.moe_gpt \\
        scripts/profile_rank.py OUT 0,128,255 prism.workloads.moe_gpt ARGS...
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import runpy
import sys
import time
from pathlib import Path


def main() -> None:
    out, ranks, module, *args = sys.argv[1:]
    rank = os.environ.get("RANK", "0")
    sys.argv = [module] + args
    if ranks == "times":  # no profile: every rank's thread CPU when the module starts and ends, in OUT/times.tsv
        began = time.thread_time_ns()
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        finally:
            Path(out).mkdir(parents=True, exist_ok=True)
            with open(f"{out}/times.tsv", "a") as f:  # one short line a rank: appended whole
                f.write(f"{rank}\t{began}\t{time.thread_time_ns()}\n")
        return
    if rank not in ranks.split(","):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    clock = time.perf_counter_ns if os.environ.get("PROFILE_CLOCK") == "wall" else time.thread_time_ns
    prof = cProfile.Profile(clock, 1e-9)
    prof.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        prof.disable()
        Path(out).mkdir(parents=True, exist_ok=True)
        prof.dump_stats(f"{out}/rank={rank}.prof")
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        Path(f"{out}/rank={rank}.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
