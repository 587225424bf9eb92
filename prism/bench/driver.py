"""Runs a program unchanged under a timer (and optionally torch.profiler): the harness of `prism bench`.

    python prism/bench/driver.py --times DIR [--profile DIR] (-m MODULE | SCRIPT) [ARGS...]

A global optimizer step post-hook stamps every iteration's end; each rank writes its stamps to
DIR/rank<R>.json and the cores it may run on (its affinity, at the end) to DIR/rank<R>.cores.json. With
--profile, the whole run is wrapped in torch.profiler (CPU activities) and each rank exports its Kineto/Chrome JSON trace there. The hook is the same in every variant a benchmark compares.
"""

import json
import os
import runpy
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook


def main() -> None:
    argv = sys.argv[1:]
    times_dir = profile_dir = None
    while argv and argv[0].startswith("--"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--times":
            times_dir = value
        elif flag == "--profile":
            profile_dir = value
    stamps: list[int] = []
    register_optimizer_step_post_hook(lambda *_: stamps.append(time.perf_counter_ns()))
    rank = int(os.environ.get("RANK", "0"))
    if argv[0] == "-m":
        target, args, run = argv[1], argv[2:], lambda: runpy.run_module(argv[1], run_name="__main__")
    else:
        target, args, run = argv[0], argv[1:], lambda: runpy.run_path(argv[0], run_name="__main__")
    sys.argv = [target] + args
    if profile_dir:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run()
        prof.export_chrome_trace(os.path.join(profile_dir, f"rank{rank}.json"))
    else:
        run()
    with open(os.path.join(times_dir, f"rank{rank}.json"), "w") as f:
        json.dump(stamps, f)
    with open(os.path.join(times_dir, f"rank{rank}.cores.json"), "w") as f:
        json.dump(sorted(os.sched_getaffinity(0)), f)


if __name__ == "__main__":
    main()
