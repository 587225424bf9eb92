"""A zygote in miniature, for tests/unit/test_immortal.py: import a few stdlib modules and run some work
once (the warm-up), collect, immortalise (`prism.runtime.launch.immortal`, unless PRISM_IMMORTAL=0), freeze, fork
a child that runs the same work again, and print as JSON how many KiB of private memory the child gained
while it ran (pages of the parent it wrote, and new ones), whether a function's code object the child used
still has its immortal count, and what `immortalise()` returned. Needs only the standard library, so that
any CPython (3.12+: the one with immortal objects) can run it:  python3.12 immortal_probe.py REPO"""

import gc
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
from prism.runtime.launch import immortal  # noqa: E402

import argparse  # noqa: E402
import difflib  # noqa: E402
import inspect  # noqa: E402
import statistics  # noqa: E402
import textwrap  # noqa: E402


def work() -> None:
    for i in range(200):
        json.loads(json.dumps({"a": [1, 2, 3], "b": str(i), "c": {"d": None}}))
        inspect.signature(json.dumps)
        textwrap.wrap("hello world " * 20, 30)
        parser = argparse.ArgumentParser()
        parser.add_argument("--x", type=int)
        parser.parse_args(["--x", "3"])
        difflib.SequenceMatcher(None, "abcde" * 5, "abdce" * 5).ratio()
        statistics.mean([1, 2, 3.5])


def private_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty:", "Private_Clean:")))


work()
gc.collect()
result = immortal.immortalise()
gc.freeze()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    before = private_kib()
    work()
    grown = private_kib() - before
    os.write(write, json.dumps({"grown_kib": grown, "code_refcnt": immortal.refcnt(work.__code__)}).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 1 << 16))
os.waitpid(pid, 0)
print(json.dumps({"immortalise": result, **child}))
