"""CPU seconds one rank of the reference workload spends creating its process groups (`build_layout`: every
rank creates every group of the job, Megatron style, W/tp + W/dp + W/pp + W/ep + W*ep/dp of them), measured in
one process (rank 0 of W; no communication), three ways:

- `torch fake`: torch's fake backend, no prism (session 7's figure);
- `capture`: prism's capture interception installed (`interception.install("capture")`, the default group a
  prism group on a fake store) with `PRISM_FAST_NONMEMBER=0`: torch's `new_group` for every call;
- `capture fast`: the same with prism's non-member `new_group` (`prism.runtime.capture.nonmember_groups`).

In a capture every rank pays it on the P slots: W times this over P is slot time before the first step (issue
12: why W=8192 costs more than 8x W=1024). `--per-call` also times `new_group` alone for a non-member, per
call, for groups of 8 and 256 members (REPEAT calls each; microseconds, best of 3).

    .venv/bin/python scripts/group_creation_cost.py 2,4,128,8 4,8,128,8 8,4,256,8
    .venv/bin/python scripts/group_creation_cost.py --per-call
"""

from __future__ import annotations

import os
import subprocess
import sys

ONE = """
import sys, time
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
how, tp, pp, dp, ep = sys.argv[1], *map(int, sys.argv[2:6])
if how == "fake":
    dist.init_process_group("fake", rank=0, world_size=tp * pp * dp, store=FakeStore())
else:
    from prism.runtime import interception
    interception.install("capture", None)
    dist.init_process_group("gloo", rank=0, world_size=tp * pp * dp, store=FakeStore())
if sys.argv[6] == "layout":
    from prism.workloads.parallel import build_layout
    began = time.process_time()
    build_layout(tp, pp, dp, ep)
    print(time.process_time() - began)
else:
    repeat, w = int(sys.argv[7]), tp * pp * dp
    for m in (8, 256):
        best = float("inf")
        for _ in range(3):
            ranks = list(range(w - m, w))
            began = time.perf_counter()
            for _ in range(repeat):
                dist.new_group(ranks)
            best = min(best, time.perf_counter() - began)
        print(m, best / repeat * 1e6)
"""
HOWS = (("torch fake", "fake", "1"), ("capture", "capture", "0"), ("capture fast", "capture", "1"))


def _run(how: str, fast: str, *args: str) -> str:
    env = dict(os.environ, PRISM_FAST_NONMEMBER=fast)
    return subprocess.run([sys.executable, "-c", ONE, how, *args], capture_output=True, text=True, check=True,
                          env=env).stdout


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--per-call"]:
        repeat = argv[1] if len(argv) > 1 else "2000"
        print(f"non-member new_group, us a call (rank 0 of W=1024, best of 3 x {repeat} calls)")
        print(f"{'':<14} {'8 members':>10} {'256 members':>12}")
        for label, how, fast in HOWS:
            us = dict(line.split() for line in _run(how, fast, "2", "4", "128", "1", "per-call", repeat).splitlines())
            print(f"{label:<14} {float(us['8']):>10.1f} {float(us['256']):>12.1f}")
        return 0
    print(f"{'layout':<22} {'W':>5} {'groups a rank':>13}" + "".join(f" {h[0] + ' CPU s':>18}" for h in HOWS)
          + f" {'fast x W / 16 slots':>20}")
    for text in argv or ["2,4,128,8", "4,8,128,8", "8,4,256,8"]:
        tp, pp, dp, ep = (int(x) for x in text.split(","))
        w = tp * pp * dp
        groups = w // tp + w // dp + w // pp + w // ep + w * ep // dp
        s = [float(_run(how, fast, str(tp), str(pp), str(dp), str(ep), "layout").split()[-1])
             for _, how, fast in HOWS]
        print(f"tp{tp}·pp{pp}·dp{dp}·ep{ep}".ljust(22) + f" {w:>5} {groups:>13,}"
              + "".join(f" {x:>18.3f}" for x in s) + f" {s[-1] * w / 16:>18.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
