"""The emulated sandbox's iteration against its own prediction, decomposed (issue 24 item 3; session 17).

For each `prism bench fidelity` config folder (CONFIG/prism0 holding graph/, calibrated/ and emulation/), for the
sandbox's default rank (the first of meta.json's "sandbox") and every iteration k >= 1 that it ran for real:

    measured(k) - predicted(k) = sum over the rank's events of iteration k of (emulated duration - calibrated one)

(both timelines are back to back: an event starts where the rank's previous one ended, so the sum is exact; the
residual column checks it). The events' terms are grouped:

- ``compute``: the compute events (the sandbox's own compute speed against the slice runs' calibrated durations);
- ``markers``, ``issues``: marker events and the op issues (the op issue path: prism's interception, the
  transport's call);
- per op kind, each blocking wait's time split in two (`prism.clock_rule`): the *model* part, what the wait would
  last under the model for the arrivals as they happened in the emulation (the sandbox's own issue times, the
  replayed virtual ranks' live ones, the others' calibrated ones; completion = last arrival + the calibrated
  transfer, p2p max(recv arrival, send arrival + transfer); end = max(start, completion) + the wait's calibrated
  own time), less the calibrated wait; and the *excess*, the emulated wait's end past that model end: the
  emulation's own delay on that exchange (what `fidelity_sandbox_delay.py`'s "vs model" leaves in: a p2p recv
  posted by the sandbox after the model's completion is not late here). A wait on a send is local in the model
  (its own time): its whole difference is excess.

The model parts are the waits' response to arrivals that moved: the sandbox computing faster or slower than
calibrated (its waits shrink or grow in return), and virtual ranks delayed by earlier excess (propagated). The
means over the iterations are given (ms per iteration; the iteration times' median is beside them, as the
bench's figure is a median). ``program`` is the emulate stage's own split (`prism.emulate.results`): the same rank
in the calibrated sweep with the sandbox's measured durations substituted; ``delay`` = measured - program.

    .venv/bin/python scripts/fidelity_sandbox_gap.py F/a/* F/b/*          # F: an unpacked artifacts.tar.xz
    .venv/bin/python scripts/fidelity_sandbox_gap.py --ops F/a/CONFIG      # + per op kind: n, excess median/p95,
                                                                          # and compute wall/CPU against the slice's
    .venv/bin/python scripts/fidelity_sandbox_gap.py --emulation emulation_after2 W/CONFIG   # fidelity_hold's
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prism.clock_rule import NEG
from prism.emulate.results import figures
from prism.runtime.replay import cone as cones
from prism.runtime.replay.cone import ARRIVE, ARRIVE_RECV, ARRIVE_SEND, LOCAL_WAIT, PLAIN, WAIT


def _job(folder: Path) -> Path:
    return folder / "prism0" if (folder / "prism0").is_dir() else folder


def decompose(job: Path, rank: int | None = None, emulation: str = "emulation") -> dict:
    """The decomposition of one emulated job's sandbox rank (see the module doc); rank None: the default;
    `emulation`: the folder of JOB holding the emulation (`prism.bench.fidelity_hold` writes several)."""
    meta = json.loads((job / emulation / "meta.json").read_text())
    sandbox = [int(r) for r in meta["sandbox"]]
    rank = sandbox[0] if rank is None else rank
    j = cones.load(job / "graph" / "events.parquet", job / "calibrated" / "timeline.parquet", set(sandbox))
    n = len(j.rank)
    key = {(int(r), int(s)): i for i, (r, s) in enumerate(zip(j.rank, j.seq))}
    em = pq.read_table(job / emulation / "events.parquet",
                       columns=["rank", "seq", "kind", "op", "start_ns", "end_ns", "source", "cpu_ns"]).to_pydict()
    cpu = np.zeros(n, dtype=np.int64)
    start, end = j.start.copy(), j.end.copy()  # the emulation's times where it has them, else calibrated
    kind = np.array([""] * n, dtype=object)
    op = np.array([""] * n, dtype=object)
    for r, s, k, o, b, e, src, c in zip(em["rank"], em["seq"], em["kind"], em["op"], em["start_ns"], em["end_ns"],
                                        em["source"], em["cpu_ns"]):
        i = key.get((int(r), int(s)))
        if i is None:
            continue
        kind[i], op[i] = k, o
        if src in ("sandbox", "replay"):
            start[i], end[i] = b, e
        if src == "sandbox":
            cpu[i] = c
    # the slice run that calibrated this rank: its compute events' CPU time and wall span (the calibrated durations)
    slice_cpu = np.zeros(n, dtype=np.int64)
    slice_wall = np.zeros(n, dtype=np.int64)
    plan = job / "slices" / "plan.parquet"
    if plan.exists():
        p = pq.read_table(plan, columns=["rank", "slice"]).to_pydict()
        k = dict(zip(p["rank"], p["slice"])).get(rank)
        sl = job / "slices" / f"slice={k}" / "events.parquet"
        if k is not None and sl.exists():
            t = pq.read_table(sl, columns=["rank", "seq", "cpu_ns", "t_start_ns", "t_end_ns"]).to_pydict()
            for r, q, c, b, e in zip(t["rank"], t["seq"], t["cpu_ns"], t["t_start_ns"], t["t_end_ns"]):
                i = key.get((int(r), int(q)))
                if i is not None:
                    slice_cpu[i], slice_wall[i] = c, e - b
    m = len(j.comm_ids)
    issue = (j.code >= ARRIVE) & (j.code <= ARRIVE_RECV)
    acc = np.full(m, NEG, dtype=np.int64)
    acc_send = np.full(m, NEG, dtype=np.int64)
    acc_recv = np.full(m, NEG, dtype=np.int64)
    np.maximum.at(acc, j.comm[issue], start[issue])
    for code, a in ((ARRIVE_SEND, acc_send), (ARRIVE_RECV, acc_recv)):
        sel = issue & (j.code == code)
        np.maximum.at(a, j.comm[sel], start[sel])
    model_done = np.where(j.p2p, np.maximum(acc_recv, acc_send + j.xfer), acc + j.xfer)
    # who arrived last at each collective: another sandbox rank than the one decomposed (whose arrival the
    # sandbox's floor does not see: it holds to its own arrival and the virtual ones, + the transfer)
    last_rank = np.full(m, -1, dtype=np.int64)
    order = np.flatnonzero(issue)
    order = order[np.lexsort((start[order], j.comm[order]))]  # by comm, then arrival: the last one wins
    last_rank[j.comm[order]] = j.rank[order]
    # collectives of a group of two sandbox members (a TP pair: gloo's own all-reduce SUM since session 17)
    comms = pq.read_table(job / "graph" / "comms.parquet", columns=["comm_id", "members"]).to_pydict()
    pair_ids = {c for c, mem in zip(comms["comm_id"], comms["members"]) if len(mem) == 2 and set(mem) <= set(sandbox)}
    pair = np.isin(j.comm_ids, np.asarray(sorted(pair_ids), dtype=np.int64))

    fig = figures(pq.read_table(job / emulation / "iterations.parquet"),
                  pq.read_table(job / "calibrated" / "iterations.parquet"))
    keep = set(fig.iterations)
    mine = np.flatnonzero(j.rank == rank)
    its = sorted(k for k in set(j.iteration[mine].tolist()) if k in keep and k >= 1 and k - 1 in keep)
    terms: dict[str, list[float]] = defaultdict(list)
    excess_by_op: dict[str, list[float]] = defaultdict(list)  # per wait (ms), iterations >= 1
    rows = []
    for k in its:
        sel = mine[j.iteration[mine] == k]
        prev = mine[j.iteration[mine] == k - 1]
        measured = end[sel[-1]] - end[prev[-1]]
        predicted = j.end[sel[-1]] - j.end[prev[-1]]
        t: dict[str, float] = defaultdict(float)
        d_em, d_cal = end[sel] - start[sel], j.end[sel] - j.start[sel]
        for i, a, b in zip(sel, d_em, d_cal):
            c, o = j.code[i], op[i] or kind[i]
            if c == WAIT or c == LOCAL_WAIT:
                s = start[i]
                comm = j.comm[i]
                if c == WAIT and comm >= 0 and model_done[comm] > NEG // 2:
                    model_end = max(s, model_done[comm]) + j.dur[i]
                else:  # local (a send's wait) or on nothing known: its calibrated own time
                    model_end = s + j.dur[i]
                excess = end[i] - model_end
                t[f"wait {o} model"] += ((model_end - s) - b) / 1e6
                t[f"wait {o} excess"] += excess / 1e6
                excess_by_op[o].append(excess / 1e6)
                if c == WAIT and comm >= 0 and not j.p2p[comm] and last_rank[comm] in sandbox \
                        and last_rank[comm] != rank:
                    t[f"wait {o} excess, last arrival another sandbox rank"] += excess / 1e6
                if c == WAIT and comm >= 0 and pair[comm]:
                    t[f"wait {o} excess, sandbox pair"] += excess / 1e6
            elif c == PLAIN and kind[i] == "compute":
                t["compute"] += (a - b) / 1e6
                t["compute cpu"] += cpu[i] / 1e6
                t["compute calibrated"] += b / 1e6
                t["slice compute cpu"] += slice_cpu[i] / 1e6
                t["slice compute wall"] += slice_wall[i] / 1e6
            elif c == PLAIN:
                t["markers"] += (a - b) / 1e6
            else:
                t["issues"] += (a - b) / 1e6
        # the first event of iteration k starts where iteration k-1's last ended: a gap would show here
        t["residual"] += ((measured - predicted) - (d_em.sum() - d_cal.sum())) / 1e6
        rows.append((measured / 1e6, predicted / 1e6))
        for name, v in t.items():
            terms[name].append(v)
    n_it = len(its)
    mean = {name: sum(v) / n_it for name, v in terms.items()}  # a term absent in an iteration counts as 0
    ranks = {r.rank: r for r in fig.ranks}
    me = ranks.get(rank)
    return {"rank": rank, "sandbox": sandbox, "iterations": its,
            "measured_mean_ms": float(np.mean([a for a, _ in rows])),
            "predicted_mean_ms": float(np.mean([b for _, b in rows])),
            "measured_median_ms": me.measured_ms if me else None, "predicted_median_ms": me.predicted_ms if me else None,
            "program_median_ms": me.program_ms if me else None, "terms": mean,
            "excess_by_op": {o: v for o, v in excess_by_op.items()}}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"


def _f(v: float) -> str:
    return f"{v:+.1f}"


def table(folders: list[Path], ops: bool = False, emulation: str = "emulation") -> list[str]:
    out = ["| config | rank (of) | predicted ms | measured ms | gap % (median) | gap ms/it (mean) | compute | issues "
           "| markers | waits: model | waits: excess, by op | residual | program - predicted % | delay (measured - "
           "program) % |", "|" + "---|" * 14]
    detail = []
    compute = []
    for folder in folders:
        job = _job(folder)
        if not (job / emulation / "meta.json").exists():
            continue
        d = decompose(job, emulation=emulation)
        t = d["terms"]
        gap = d["measured_mean_ms"] - d["predicted_mean_ms"]
        model = sum(v for k, v in t.items() if k.endswith(" model"))
        excess = {k[5:-7]: v for k, v in t.items() if k.endswith(" excess")}
        compute.append(f"| {'/'.join(folder.resolve().parts[-3:])} | {t.get('compute calibrated', 0) + t.get('compute', 0):.1f} "
                       f"| {t.get('compute cpu', 0):.1f} | {t.get('compute calibrated', 0):.1f} | "
                       f"{t.get('slice compute wall', 0):.1f} | {t.get('slice compute cpu', 0):.1f} | "
                       f"{_ratio(t.get('compute cpu', 0), t.get('slice compute cpu', 0))} |")
        ex = ", ".join(f"{o} {_f(v)}" for o, v in sorted(excess.items(), key=lambda kv: -abs(kv[1])) if abs(v) >= 0.05)
        pm, me, pr = d["program_median_ms"], d["measured_median_ms"], d["predicted_median_ms"]
        name = "/".join(folder.resolve().parts[-3:]) if folder.name != "prism0" else str(folder)
        out.append(f"| {name} | {d['rank']} (of {','.join(map(str, d['sandbox']))}) | {pr:.2f} | {me:.2f} | "
                   f"{100 * (me - pr) / pr:+.1f} | {_f(gap)} | {_f(t.get('compute', 0))} | {_f(t.get('issues', 0))} | "
                   f"{_f(t.get('markers', 0))} | {_f(model)} | {_f(sum(excess.values()))} ({ex}) | "
                   f"{t.get('residual', 0):+.2f} | {100 * (pm - pr) / pr:+.1f} | {100 * (me - pm) / pr:+.1f} |")
        if ops:
            for o, v in sorted(d["excess_by_op"].items()):
                a = np.asarray(v)
                other = t.get(f"wait {o} excess, last arrival another sandbox rank")
                in_pair = t.get(f"wait {o} excess, sandbox pair")
                detail.append(f"| {name} | wait {o} | {len(a)} | {np.median(a):.2f} / {np.percentile(a, 95):.2f} / "
                              f"{a.max():.2f} | {t.get(f'wait {o} model', 0):+.1f} | {t.get(f'wait {o} excess', 0):+.1f} "
                              f"| {'-' if other is None else f'{other:+.1f}'} | {'-' if in_pair is None else f'{in_pair:+.1f}'} |")
    if detail:
        out += ["", "| config | wait on | n | excess ms: median / p95 / max | model ms/it | excess ms/it | of it, "
                "where another sandbox rank arrived last, ms/it | of it, in a group of two sandbox ranks, ms/it |",
                "|---|---|---|---|---|---|---|---|"] + detail
        out += ["", "compute, ms per iteration of the rank (mean over the iterations):", "",
                "| config | sandbox wall | sandbox CPU | calibrated (the slice's wall) | slice wall | slice CPU "
                "| sandbox CPU / slice CPU |", "|---|---|---|---|---|---|---|"] + compute
    return out


def main(argv: list[str]) -> int:
    ops = "--ops" in argv
    argv = [a for a in argv if a != "--ops"]
    emulation = "emulation"
    if "--emulation" in argv:
        at = argv.index("--emulation")
        emulation = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    folders = [Path(a) for a in argv]
    if not folders:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("\n".join(table(folders, ops, emulation)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
