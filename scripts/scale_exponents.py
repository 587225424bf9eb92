"""Per-stage wall and memory of `prism bench capture --json` rows against W, with the growth exponent k of each
step (wall ∝ W^k between two sizes), as docs/benchmarks.md's cost tables print them (issue 25 item 3).

    .venv/bin/python scripts/scale_exponents.py docs/results/scale/s14/weak/weak.json docs/results/scale/s14/w8192/w8192.json
"""
from __future__ import annotations

import json
import math
import sys

COLUMNS = [("capture s", lambda r: r["wall_s"]), ("capture PSS GiB", lambda r: r["pss_peak"] / 2**30),
           ("rank private MiB med", lambda r: r["rank_private_mib_median"]),
           ("rank private MiB max", lambda r: r["rank_private_mib_max"]),
           ("setup s", lambda r: r["phases_s"]["setup"]), ("steps s", lambda r: r["phases_s"]["steps"]),
           ("exits s", lambda r: r["phases_s"]["exits"]), ("set-up CPU s", lambda r: r["setup_cpu_s"]),
           ("ranks CPU s", lambda r: r["ranks_cpu_s"]), ("graph s", lambda r: r["graph_s"]),
           ("graph RSS GiB", lambda r: r["graph_rss"] / 2**30), ("plan s", lambda r: r["plan_s"]),
           ("calibrate s", lambda r: r["calibrate_s"]), ("emulate s", lambda r: r["emulate_s"]),
           ("emulate PSS GiB", lambda r: r["emulate_pss"] / 2**30)]


def main(paths: list[str]) -> None:
    rows = sorted((r for p in paths for r in json.load(open(p))), key=lambda r: r["W"])
    ws = [r["W"] for r in rows]
    print("| quantity | " + " | ".join(f"W={w}" for w in ws) + " | " +
          " | ".join(f"k {a}->{b}" for a, b in zip(ws, ws[1:])) + " |")
    print("|---" * (1 + 2 * len(ws) - 1) + "|")
    for name, get in COLUMNS:
        vals = [get(r) for r in rows]
        ks = [math.log(b / a) / math.log(wb / wa) if a > 0 and b > 0 else float("nan")
              for a, b, wa, wb in zip(vals, vals[1:], ws, ws[1:])]
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + " | " + " | ".join(f"{k:.2f}" for k in ks) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
