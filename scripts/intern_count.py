"""Count the names a capture rank interns through `sys.intern` from Python (pathlib interns every path part it
parses), for docs/benchmarks.md "Session 16". A `--preload` module: the zygote imports it before the forks, so
every rank counts its own calls and writes them, at its end, to $INTERN_COUNTS/RANK.json (then this script, run
as a program, summarises the folder). C-level interning (attribute names, `PyDict_SetItemString`) is not counted.

    mkdir -p /tmp/ic && cd scripts && INTERN_COUNTS=/tmp/ic PYTHONPATH=$PWD ../.venv/bin/python -m prism.cli launch \
        --nproc 64 --mode capture --devices 2 --out /tmp/ic-job --force --preload prism.workloads.moe_gpt \
        --preload intern_count -m prism.workloads.moe_gpt --tp 2 --pp 2 --dp 16 --ep 2 --steps 2 ... (the bench's)
    python3 scripts/intern_count.py /tmp/ic
"""

from __future__ import annotations

import collections
import json
import os
import sys


def _kind(name: str) -> str:
    if "-" in name:
        return name.split("-")[0][:12]  # c-GROUP-SEQ-rI (a collective's file), p-... (point to point)
    return "payload digest" if len(name) > 30 else name[:12]


def install() -> None:
    from prism.runtime.capture import client

    real, seen = sys.intern, collections.Counter()

    def counting(s):
        seen[_kind(s)] += 1
        return real(s)

    sys.intern = counting
    write = client.CaptureClient.write_rank_files

    def write_and_count(self):
        with open(os.path.join(os.environ["INTERN_COUNTS"], f"{self.rank}.json"), "w") as f:
            json.dump({"rank": self.rank, "total": sum(seen.values()), "top": seen.most_common(6)}, f)
        return write(self)

    client.CaptureClient.write_rank_files = write_and_count


def summary(folder: str) -> str:
    rows = [json.load(open(os.path.join(folder, n))) for n in os.listdir(folder) if n.endswith(".json")]
    if not rows:
        return f"no rank wrote its count in {folder}"
    totals = sorted(r["total"] for r in rows)
    top = max(rows, key=lambda r: r["total"])
    return (f"{len(rows)} ranks; names interned a rank: median {totals[len(totals) // 2]}, max {totals[-1]} "
            f"(rank {top['rank']}: {top['top']})")


if __name__ == "__main__":
    print(summary(sys.argv[1]))
elif os.environ.get("INTERN_COUNTS"):
    install()
