"""The emulated sandbox's compute speed against its slices', the truths' around it and the other stream's load
(issue 24 item 3; session 19). Per prism run of each config of a device call's streams (unpacked bench folders):

- the sandbox ranks' compute CPU (the program thread's, `recorder._cpu` = thread time) over the slice pass that
  calibrated them (the same ranks' same events, iterations >= 1): per rank, and all ranks pooled;
- the same over the truth runs just before and just after the emulation (its config's, same ranks and events);
- the sandbox's compute wall / CPU (preemption, the rank's own other threads);
- the other stream's busy cores while the emulation ran and while its slice pass ran (`stream_overlap.busy_during`).

    .venv/bin/python scripts/sandbox_compute_speed.py F/call2/a F/call2/b      # a call's two streams
    .venv/bin/python scripts/sandbox_compute_speed.py F/call3/a                # one stream alone (W=16)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_overlap import busy_during, windows  # noqa: E402

from prism.bench.fidelity_breakdown import cpu_ratio, sources  # noqa: E402


def sandbox_compute(job: Path) -> tuple[dict[int, dict[int, int]], dict[int, tuple[int, int]], tuple[float, float]]:
    """Per sandbox rank: compute events' CPU by seq (iterations >= 1); (wall, CPU) sums; the window (s)."""
    t = pq.read_table(job / "emulation" / "events.parquet",
                      columns=["rank", "seq", "kind", "iteration", "t_start_ns", "t_end_ns", "cpu_ns", "source"])
    d = t.to_pydict()
    cpu: dict[int, dict[int, int]] = {}
    wall: dict[int, list[int]] = {}
    lo, hi = [], []
    for r, s, k, it, b, e, c, src in zip(d["rank"], d["seq"], d["kind"], d["iteration"], d["t_start_ns"],
                                          d["t_end_ns"], d["cpu_ns"], d["source"]):
        if src != "sandbox":
            continue
        lo.append(b)
        hi.append(e)
        if k == "compute" and it >= 1:
            cpu.setdefault(r, {})[s] = c
            w = wall.setdefault(r, [0, 0])
            w[0] += e - b
            w[1] += c
    return cpu, {r: tuple(v) for r, v in wall.items()}, (min(lo) / 1e9, max(hi) / 1e9)


def pooled(base: dict[int, dict[int, int]], other: dict[int, dict[int, int]]) -> float:
    num = den = 0
    for r, o in other.items():
        b = base.get(r)
        if not b:
            continue
        common = [k for k in o if k in b]
        num += sum(o[k] for k in common)
        den += sum(b[k] for k in common)
    return num / den if den else float("nan")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    streams = [Path(a) for a in argv]
    wins = {s: windows(s) for s in streams}
    print("| stream | config | run | variant | sandbox ranks | CPU / slice CPU: pooled (per rank min-max) "
          "| CPU / truth before | CPU / truth after | slice CPU / truth before | wall / CPU | other stream busy: emulation "
          "| slices | bench gap % |")
    print("|" + "---|" * 13)
    rows = []
    for s in streams:
        other = [w for o in streams if o != s for w in wins[o]]
        bench = {c["config"]: c for c in json.loads((s / "fidelity.json").read_text())}
        for config in sorted(p for p in s.iterdir() if (p / "truth0").is_dir()):
            per, began = sources(config)
            truths = sorted((began[n], n) for n in per if n.startswith("truth"))
            c = bench.get(config.name, {})
            labels = list(c.get("variant") or [])
            for job in sorted(config.glob("prism[0-9]*"), key=lambda p: int(p.name[5:])):
                if not (job / "emulation" / "events.parquet").is_file():
                    continue
                i = int(job.name[5:])
                cpu, wall, w = sandbox_compute(job)
                label = job.name + " slices" if i else "slices"
                sl = {r: v[1] for r, v in per.get(label, {}).items()}
                before = [n for t, n in truths if t < w[0]]
                after = [n for t, n in truths if t > w[1]]
                tb = {r: v[1] for r, v in per[before[-1]].items()} if before else {}
                ta = {r: v[1] for r, v in per[after[0]].items()} if after else {}
                per_rank = [cpu_ratio(sl[r], cpu[r]) for r in sorted(cpu) if r in sl]
                ws = sum(v[0] for v in wall.values()) / max(1, sum(v[1] for v in wall.values()))
                sw = [x for x in wins[s] if x["config"] == config.name and x["name"] == f"{job.name} slices"]
                busy_e = busy_during(w, other) if other else 0.0
                busy_s = busy_during(sw[0]["w"], other) if other and sw else 0.0
                em = (c.get("emulated") or [None] * (i + 1))[i] if i < len(c.get("emulated") or []) else None
                gap = 100 * (em["sandbox_ms"] / em["pred_rank_ms"] - 1) if em and em.get("sandbox_ms") else float("nan")
                var = labels[i] if i < len(labels) else "none"
                r_sl, r_tb, r_ta = pooled(sl, cpu), pooled(tb, cpu), pooled(ta, cpu)
                r_s_tb = pooled(tb, sl)
                rows.append((var, r_sl, busy_e - busy_s, gap, ws))
                print(f"| {s.parent.name}/{s.name} | {config.name} | {i} | {var} | {','.join(map(str, sorted(cpu)))} | "
                      f"{r_sl:.3f} ({min(per_rank):.3f}-{max(per_rank):.3f}) | {r_tb:.3f} | {r_ta:.3f} | {r_s_tb:.3f} | "
                      f"{ws:.3f} | {busy_e:.1f} | {busy_s:.1f} | {gap:+.1f} |")
    none = [r for r in rows if r[0] == "none"]
    if len(none) >= 3:
        x = np.array([r[1] for r in none])
        db = np.array([r[2] for r in none])
        g = np.array([r[3] for r in none])
        print(f"\nruns of variant none: {len(none)}; CPU / slice CPU mean {x.mean():.3f}, median {np.median(x):.3f}, "
              f"min-max {x.min():.3f}-{x.max():.3f}; wall/CPU mean {np.mean([r[4] for r in none]):.3f}")
        if db.std() > 0:
            print(f"r(CPU / slice CPU, other stream busy during emulation - during slices) = {np.corrcoef(x, db)[0, 1]:+.2f}")
        print(f"r(CPU / slice CPU, bench gap) = {np.corrcoef(x, g)[0, 1]:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
