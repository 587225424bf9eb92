"""A capture rank's CPU in three parts, per W: before the program (the fork's end to the module's start: the
interception, the first slot), the program (`scripts/profile_rank.py OUT times ...`: the module's start to its
end), after it (the final drain and the rank's files, to capture_stats.json's logical_ns); median and mean over the
ranks, and the slope of the total against W (ms a rank of W) through every DIR given.

    .venv/bin/python scripts/rank_cpu_parts.py --save DIR JOB   # once per capture: DIR/logical.tsv from JOB/raw
    .venv/bin/python scripts/rank_cpu_parts.py DIR...            # DIR: times.tsv and logical.tsv of one capture
"""

from __future__ import annotations

import glob
import json
import statistics
import sys


def save(folder: str, job: str) -> None:
    rows = [json.load(open(p)) for p in glob.glob(f"{job}/raw/rank=*/capture_stats.json")]
    with open(f"{folder}/logical.tsv", "w") as f:
        f.writelines(f"{r['rank']}\t{r['logical_ns']}\n" for r in sorted(rows, key=lambda r: r["rank"]))


def parts(folder: str) -> dict:
    times = {int(r): (int(a), int(b)) for r, a, b in (l.split() for l in open(f"{folder}/times.tsv"))}
    logical = {int(r): int(n) for r, n in (l.split() for l in open(f"{folder}/logical.tsv"))}
    ranks = sorted(set(times) & set(logical))
    if len(ranks) != len(logical):
        raise SystemExit(f"{folder}: {len(logical) - len(ranks)} ranks have no times.tsv line")
    return {"W": len(ranks), "before": [times[r][0] / 1e6 for r in ranks],
            "program": [(times[r][1] - times[r][0]) / 1e6 for r in ranks],
            "after": [(logical[r] - times[r][1]) / 1e6 for r in ranks], "total": [logical[r] / 1e6 for r in ranks]}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--save"]:
        save(*argv[1:3])
        return 0
    rows = [parts(d) for d in argv]
    print("W\t" + "\t".join(f"{k} ms median/mean" for k in ("before", "program", "after", "total")))
    for r in rows:
        print(f"{r['W']}\t" + "\t".join(f"{statistics.median(r[k]):.1f}/{statistics.mean(r[k]):.1f}"
                                        for k in ("before", "program", "after", "total")))
    if len(rows) > 1:
        for stat in (statistics.median, statistics.mean):
            pts = [(r["W"], stat(r["total"])) for r in rows]
            mx, my = sum(w for w, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            b = sum((w - mx) * (y - my) for w, y in pts) / sum((w - mx) ** 2 for w, _ in pts)
            print(f"total's slope ({stat.__name__}): {b * 1e3:.1f} us a rank of W")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
