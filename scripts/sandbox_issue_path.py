"""The emulated sandbox's op issues against the calibrated ones (issue 24 item 3; session 19): per prism run given
(CONFIG/prismN folders) and rank (default 0), the collective events of iterations >= 1 by (op, group, async):
the emulated issue's wall (median / mean), the calibrated one (the slice's), the emulated issue's own CPU.

    .venv/bin/python scripts/sandbox_issue_path.py /tmp/F19/call2/b/dp8/prism0 [--rank R] ...
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq


def main(argv: list[str]) -> int:
    rank = 0
    if "--rank" in argv:
        at = argv.index("--rank")
        rank = int(argv[at + 1])
        argv = argv[:at] + argv[at + 2:]
    print("| run | op | group | async | bytes | n | emulated median / mean | calibrated median / mean | emulated CPU median |")
    print("|---|---|---|---|---|---|---|---|---|")
    for job in map(Path, argv):
        g = pq.read_table(job / "graph" / "events.parquet", columns=["rank", "seq", "kind", "op", "group_name", "iteration",
                                                                    "is_async", "bytes"]).to_pandas()
        tl = pq.read_table(job / "calibrated" / "timeline.parquet").to_pandas().rename(
            columns={"start_ns": "cs", "end_ns": "ce"})
        e = pq.read_table(job / "emulation" / "events.parquet",
                          columns=["rank", "seq", "start_ns", "end_ns", "cpu_ns", "source"]).to_pandas()
        e = e[(e.source == "sandbox") & (e["rank"] == rank)]
        m = e.merge(g, on=["rank", "seq"]).merge(tl[["rank", "seq", "cs", "ce"]], on=["rank", "seq"])
        m = m[(m.iteration >= 1) & (m.kind == "collective")]
        m["emu"], m["cal"], m["cpu"] = (m.end_ns - m.start_ns) / 1e6, (m.ce - m.cs) / 1e6, m.cpu_ns / 1e6
        for (op, gr, a), x in m.groupby(["op", "group_name", "is_async"], observed=True):
            print(f"| {'/'.join(job.parts[-3:])} | {op} | {gr} | {a} | {int(x.bytes.median())} | {len(x)} | "
                  f"{x.emu.median():.3f} / {x.emu.mean():.3f} | {x.cal.median():.3f} / {x.cal.mean():.3f} | "
                  f"{x.cpu.median():.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
