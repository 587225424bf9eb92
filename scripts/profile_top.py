"""The hottest functions of a py-spy profile in raw (collapsed stacks) form, e.g. the zygote's during a capture
(docs/results/scale/s7/probe/zygote-w1024.txt.gz, written by `py-spy record --format raw`):

    python3 scripts/profile_top.py docs/results/scale/s7/probe/zygote-w1024.txt.gz [--top 25] [--rate 100]

Prints the samples (and seconds at the sampling rate) per function by itself (self) and with what it called
(inclusive), and how many fall under the zygote's phases: imports and warm-up, immortalising, the fork loop,
the coordinator's loop, the unlinking thread.
"""

from __future__ import annotations

import argparse
import gzip
from collections import Counter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy's samples per second (-r)")
    parser.add_argument("--fork-frame", default="supervise (prism/runtime/launch/zygote.py:146)",
                        help="the frame of the zygote's os.fork() call in the profiled version (33f18d4: line 146)")
    args = parser.parse_args()
    opener = gzip.open if args.profile.endswith(".gz") else open
    own, within, phases = Counter(), Counter(), Counter()
    total = 0
    with opener(args.profile, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1]] += n
            for frame in set(frames):
                within[frame] += n
            if "_unlink_all" in stack:
                phases["unlinking thread"] += n
            elif frames[-1] == args.fork_frame:
                phases["fork loop (os.fork)"] += n
            elif "EpollSelector.select" in frames[-1]:
                phases["coordinator loop, in epoll (waiting)"] += n
            elif "supervise" in stack:
                phases["coordinator loop, working"] += n
            elif "immortalise" in stack:
                phases["immortalise"] += n
            else:
                phases["imports, warm-up and the rest"] += n
    sec = 1.0 / args.rate
    print(f"{total} samples ({total * sec:.1f} s at {args.rate:g}/s)")
    for name, n in phases.most_common():
        print(f"  {name:<42} {n:>7} {n * sec:8.1f} s")
    for title, counter in (("self", own), ("inclusive", within)):
        print(f"-- {title}")
        for frame, n in counter.most_common(args.top):
            print(f"{n:>7} {n * sec:8.1f} s  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
