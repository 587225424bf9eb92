"""The session-12 ring table of docs/benchmarks.md from ring.jsonl (scripts/replay_ring.py rows):
    .venv/bin/python docs/results/replay/s12/table.py docs/results/replay/s12/ring.jsonl"""
import json
import sys
from collections import defaultdict

rows = defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    rows[(d["members"], d["layout"])].append(d)
print("| members | layout | member 0 median ms | server CPU ms / all-reduce | server wall ms | load1 |")
print("|---|---|---|---|---|---|")
for (n, layout), ds in sorted(rows.items()):
    f = lambda k: ", ".join("-" if d.get(k) is None else str(d[k]) for d in ds)  # noqa: E731
    print(f"| {n} | {layout} | {f('member0_median_ms')} | {f('server_cpu_ms_per_op')} | {f('server_wall_ms_per_op')} "
          f"| {f('load1')} |")
