"""The weak-layout capture's wall on the 16-core host at a larger W, from what was measured (issue 25 item 3):

- the host's weak captures (`prism bench capture --weak`, P=16, main before session 13: `--host` JSON rows of
  W=128 and 1024): a rank's slot time s(W) = coordinator_wall_s × P / W (the coordinator's wall runs from the
  forks' end to its close: the ranks' set-up and steps), fitted as s = a + b·W through the two sizes (a rank's
  CPU grows linearly in W where every member of an N-member group reads N files, and the program's
  every-group `new_group` loop is O(W) a rank); the host's fixed part (the zygote's start, warm-up, the
  launcher: wall − coordinator wall − forks) at the largest size; its forks scaled linearly in W;
- the same fit of a rank's CPU here (`capture_phases.py` tables before and after a change, `logical_s_median`
  against W): the change's factor on b (after / before) is applied to the host's b.

    .venv/bin/python scripts/capture_predict.py --host docs/results/scale/s10/device/weak.json \\
        --before docs/results/scale/s13/before/phases.tsv --after docs/results/scale/s13/after/phases.tsv \\
        --predict 2048,4096,8192

Prints the fits and, per W, the predicted capture wall before and after the change. An estimate, not a
measurement: it assumes the host's slot time grows as this box's rank CPU does.
"""

from __future__ import annotations

import argparse
import csv
import json


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of y = a + b·x, least squares."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def local_slope(tsv: str) -> tuple[float, float]:
    with open(tsv) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return line([(float(r["W"]), float(r["logical_s_median"])) for r in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", required=True)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--predict", default="2048,4096,8192")
    parser.add_argument("--sizes", default="128,1024", help="the host rows to fit")
    parser.add_argument("--factor", type=float, action="append", default=[],
                        help="also predict with this factor on b (repeatable; e.g. from scripts/rank_cpu_parts.py)")
    args = parser.parse_args()
    wanted = [int(w) for w in args.sizes.split(",")]
    rows = {r["W"]: r for r in json.load(open(args.host)) if r.get("coordinator_wall_s")}
    missing = [w for w in wanted if w not in rows]
    if missing:
        raise SystemExit(f"{args.host}: no capture row with coordinator_wall_s for W={missing}")
    pts = [(w, rows[w]["coordinator_wall_s"] * rows[w]["P"] / w) for w in wanted]
    a, b = line(pts)
    top = rows[max(wanted)]
    fixed = top["wall_s"] - top["coordinator_wall_s"] - top["fork_s"]
    fork_per_rank = top["fork_s"] / top["W"]
    p = top["P"]
    a0, b0 = local_slope(args.before)
    a1, b1 = local_slope(args.after)
    factor = b1 / b0
    print(f"host slot time a rank s(W) = {a:.4f} + {b * 1e6:.1f}e-6·W s (W={','.join(map(str, wanted))}, P={p}); "
          f"fixed {fixed:.1f} s, forks {fork_per_rank * 1e3:.2f} ms a rank")
    print(f"here, a rank's CPU (median): before {a0:.4f} + {b0 * 1e6:.1f}e-6·W s, "
          f"after {a1:.4f} + {b1 * 1e6:.1f}e-6·W s: "
          f"factor on b {factor:.2f}")
    factors = [1.0, factor] + args.factor
    print("W\t" + "\t".join(f"factor_{f:.2f}_s" for f in factors) + "\t(factor 1: before)")
    for w in (int(x) for x in args.predict.split(",")):
        base = fixed + fork_per_rank * w
        print(f"{w}\t" + "\t".join(f"{base + w / p * (a + f * b * w):.0f}" for f in factors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
