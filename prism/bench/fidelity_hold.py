"""The emulated sandbox against its prediction, two prisms on one calibrated job (A/B), and where it differs.

    python -m prism.bench.fidelity_hold --config NAME --work DIR --base TREE [--steps 8] [--timeout S]
                                        [--devices P] [--repeats N] [--prepared] [--env-after K=V ...]

Runs the fidelity bench's prism pipeline for one config (`fidelity.run_prism`: capture, graph, plan,
slices, calibrate; no truth runs), then `prism emulate` on that job with the bench's sandbox (the default
rank's slice) twice: first with the prism of TREE (a checkout of another commit: "before"), then with this
one ("after"), each into its own folder (DIR/<config>/emulation_<variant>). Paired on one job, the two
differ only by the emulation; `sandbox - predicted` (points of the prediction for the default rank) is what
the emulation adds. Prints and writes DIR/<config>/hold.json: per variant the bench's numbers
(`fidelity.emulated_sandbox`) and `breakdown`: per (kind, op, group) of the default rank, the ms per
iteration the sandbox spent against the calibrated timeline (compute together), and per real collective
group the ms per iteration its waits ended past the model's completion for the emulation's own arrivals
(`late_ms`: the last arrival of any member, sandbox or replayed, + the calibrated transfer).
`sandbox - computed` (%) compares the sandbox rank with the same rank in the emulated job's sweep (its
measured durations substituted, `computed_rank_ms`): what the model gives at the sandbox's own speed, so
it is the emulation's own delay, without the sandbox computing faster or slower than the slice runs did.
`by_kind` sums `spent` per event kind and op (compute; each collective op's issue and wait; send, recv):
the sandbox's measured duration minus the calibrated one, ms per iteration; `compute_cpu_ms` is the
sandbox's compute events' own CPU time (``cpu_ns``) per iteration: compute wall minus it is time the
rank's thread was off the CPU or waiting for the GIL inside its compute.
`--rescore DIR/<config>` recomputes hold.json from the saved job (the files scripts/device_hold.sh tars);
`--show JSON...` prints saved ones.

On a small host (session 8, docs/fidelity.md "Local, session 8"): `--devices P` calibrates for P slots
instead of the config's own; `--sandbox rank` emulates the default rank alone (its groups then have
virtual members: their collectives run the protocol); `--repeats N` emulates N times per variant,
interleaved (before, after, before, ...: the box's load drifts alike for both), into
`emulation_<variant>`, then `emulation_<variant>2` .. `<variant>N` (the first stays where `--rescore` and
device_hold.sh look); `--prepared` reuses the job already in DIR/<config> (its calibration; its earlier
emulations are removed) and only emulates, so the pipeline and the A/B can run in separate short locked
runs; `--env-after K=V` sets an environment variable for the "after" variant only (with `--base` this
tree: an A/B of one knob); `--after TREE` takes the "after" prism from another tree than this one (a
snapshot: edits to this tree during a run then change neither variant).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prism import job as job_files
from prism.bench import fidelity, fidelity_sandbox

VARIANTS = ("before", "after")


def _strings(col) -> np.ndarray:
    return fidelity._strings(col)


def breakdown(job: Path, folder: str, rank: int) -> dict:
    """Where rank `rank`'s emulated iterations (1 .. last-1) differ from the calibrated timeline's."""
    from prism.calibrate import durations as rules

    em = pq.read_table(job_files.table_file(job / folder, "events"))
    em = em.filter(pa.array(_strings(em.column("source")) != "computed"))
    src = _strings(em.column("source"))
    kind, op, grp = (_strings(em.column(c)) for c in ("kind", "op", "group_name"))
    rk, it, cid, st, en, opev, evid, seq = (em.column(c).to_numpy() for c in
                                            ("rank", "iteration", "comm_id", "start_ns", "end_ns", "op_event_id",
                                             "event_id", "seq"))
    tl = pq.read_table(job_files.calibrated(job))
    pred = {(int(r), int(q)): int(e) - int(s) for r, q, s, e in zip(*(tl.column(c).to_numpy() for c in
                                                                       ("rank", "seq", "start_ns", "end_ns")))}
    mine = (rk == rank) & (src == "sandbox")
    last = int(it[mine].max())
    keep = mine & (it >= 1) & (it < last)
    iterations = max(len(set(it[keep].tolist())), 1)
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for i in np.flatnonzero(keep):
        name = "compute" if kind[i] == "compute" else f"{kind[i]} {op[i]} group {grp[i]}"
        v = acc[name]
        v[0] += 1
        v[1] += (en[i] - st[i]) / 1e6
        v[2] += pred[(int(rk[i]), int(seq[i]))] / 1e6
    spent = {k: {"n": v[0] / iterations, "sandbox_ms": v[1] / iterations, "pred_ms": v[2] / iterations,
                 "excess_ms": (v[1] - v[2]) / iterations} for k, v in sorted(acc.items(), key=lambda kv: kv[1][2] - kv[1][1])}
    cpu = em.column("cpu_ns").to_numpy() if "cpu_ns" in em.column_names else None
    own = keep & (kind == "compute")
    compute_cpu_ms = (float(cpu[own].clip(min=0).sum()) / 1e6 / iterations) if cpu is not None else None
    by_kind: dict[str, dict] = defaultdict(lambda: {"n": 0.0, "sandbox_ms": 0.0, "pred_ms": 0.0, "excess_ms": 0.0})
    for k, v in spent.items():
        b = by_kind[k.split(" group ")[0]]
        for f in b:
            b[f] += v[f]
    comms = pq.read_table(job_files.graph_file(job, "comms"), columns=["comm_id"]).column("comm_id").to_numpy()
    timed = job_files.slice_transfers(job, job_files.TIMED_SLICES)
    transfers = timed if timed.is_file() else job_files.slice_transfers(job)
    xfer = dict(zip(comms.tolist(), rules.read_transfers(transfers, comms).tolist()))
    arrive: dict[int, int] = {}
    for i in np.flatnonzero(kind == "collective"):
        arrive[int(cid[i])] = max(arrive.get(int(cid[i]), 0), int(st[i]))
    wait_of = {int(opev[i]): i for i in np.flatnonzero((kind == "wait") & mine)}  # (the last wait on each op)
    late: dict[str, list[float]] = defaultdict(list)
    for i in np.flatnonzero(keep & (kind == "collective")):
        w = wait_of.get(int(evid[i]))
        if w is None:
            continue
        model = arrive[int(cid[i])] + xfer[int(cid[i])]
        late[f"{op[i]} group {grp[i]}"].append((int(en[w]) - max(model, int(st[w]))) / 1e6)
    late_ms = {k: {"n": len(v) / iterations, "sum_ms": float(np.sum(v)) / iterations,
                   "median_ms": float(np.median(v)), "p90_ms": float(np.percentile(v, 90))} for k, v in late.items()}
    return {"iterations": iterations, "spent": spent, "by_kind": dict(by_kind), "compute_cpu_ms": compute_cpu_ms,
            "late_ms": late_ms}


def score(job: Path, variant: str) -> dict:
    """The bench's numbers of one saved emulation of `job` (its folder `emulation_<variant>`)."""
    folder = job / f"emulation_{variant}"
    if (job / f"emulate_{variant}.failed").is_file():
        return {"error": (job / f"emulate_{variant}.failed").read_text()[:500]}
    shutil.rmtree(job_files.emulation(job), ignore_errors=True)
    os.symlink(folder.name, job_files.emulation(job))
    try:
        out = fidelity.emulated_sandbox(job, pq.read_table(job_files.calibrated(job)), None)
    finally:
        job_files.emulation(job).unlink()
    if out.get("sandbox_ms") and out.get("pred_rank_ms"):
        out["sandbox_minus_pred_pct"] = 100.0 * (out["sandbox_ms"] - out["pred_rank_ms"]) / out["pred_rank_ms"]
    if out.get("sandbox_ms") and out.get("computed_rank_ms"):
        out["sandbox_minus_computed_pct"] = (100.0 * (out["sandbox_ms"] - out["computed_rank_ms"])
                                             / out["computed_rank_ms"])
    meta = json.loads(job_files.meta_file(folder).read_text()).get("emulation", {})
    out["transfer_holds"], out["transfer_hold_s"] = meta.get("transfer_holds"), meta.get("transfer_hold_s")
    diag = (meta.get("rank_diagnostics") or {}).get(str(out["rank"])) or {}  # the whole run's
    out["threads_cpu_s"], out["hops"] = diag.pop("threads_cpu_s", None), diag or None
    out["breakdown"] = breakdown(job, folder.name, int(out["rank"]))
    return out


def run_name(variant: str, i: int) -> str:
    """The folder suffix of a variant's i-th emulation (0-based): `before`, `before2`, ..."""
    return variant if i == 0 else f"{variant}{i + 1}"


def parse_env(pairs: list[str]) -> dict[str, str]:
    """`--env-after K=V` arguments as a dict (ValueError naming a malformed one)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-after {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


def run(cfg, work: Path, base: Path, steps: int, timeout: float, devices: int | None = None, repeats: int = 1,
        prepared: bool = False, env_after: dict[str, str] | None = None, sandbox: str = "slice",
        after: Path | None = None) -> dict:
    job = work / cfg.name
    log = job / "log.txt"
    if prepared:
        if not (job_files.calibrated(job)).is_file():
            raise FileNotFoundError(f"--prepared: {job} holds no calibrated/timeline.parquet (run once without "
                                    "--prepared to build it)")
        old = json.loads((job / "hold.json").read_text()) if (job / "hold.json").is_file() else {}
        times = old.get("stage_s", {})
        for stale in [*job.glob("emulation_*"), *job.glob("emulate_*.failed")]:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    else:
        shutil.rmtree(job, ignore_errors=True)
        job.mkdir(parents=True)
        times = fidelity.run_prism(cfg, cfg.args(steps, fidelity.MODEL), devices or cfg.devices, job, log, timeout,
                                   emulate=False)
        times = {k: round(v, 1) for k, v in times.items()}
    ranks = fidelity_sandbox.sandbox_ranks(job, whole_slice=sandbox == "slice")
    for i in range(repeats):
        for variant in VARIANTS:
            name = run_name(variant, i)
            cmd = [sys.executable, "-m", "prism.cli", "emulate", "--job", str(job.resolve()), "--sandbox",
                   ",".join(map(str, ranks)), "--devices", str(len(ranks)), "--force"]
            tree = base if variant == "before" else (after or Path(__file__).resolve().parents[2])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree.resolve())] + [
                p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            if variant == "after":
                env.update(env_after or {})
            with open(log, "ab") as f:
                f.write(f"$ ({name}: {tree}) {' '.join(cmd)}\n".encode())
                f.flush()
                code = subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      timeout=timeout).returncode
            if code != 0:
                (job / f"emulate_{name}.failed").write_text(f"exit {code}: see {log}")
            elif job_files.emulation(job).is_dir():
                job_files.emulation(job).rename(job / f"emulation_{name}")
    res = {"config": cfg.name, "sandbox": ranks, "stage_s": times, "repeats": repeats, "env_after": env_after or {},
           **{variant: score(job, variant) for variant in VARIANTS}}
    if repeats > 1:
        res["runs"] = {v: [res[v]] + [score(job, run_name(v, i)) for i in range(1, repeats)] for v in VARIANTS}
    return res


def _kind_line(k: str, v: dict) -> str:
    return (f"  {k:42} {v['n']:6.1f}/it  sandbox {v['sandbox_ms']:8.2f}  pred {v['pred_ms']:8.2f}  "
            f"excess {v['excess_ms']:+8.2f} ms/it")


def summary(res: dict) -> list[str]:
    """Per variant over its repeats: sandbox - predicted (%) of each run, their median, and the median
    per-kind excess (ms per iteration)."""
    runs = res.get("runs")
    if not runs:
        return []
    lines = ["-- over the repeats (median):"]
    for variant in VARIANTS:
        ok = [r for r in runs[variant] if not r.get("error") and r.get("sandbox_minus_pred_pct") is not None]
        if not ok:
            lines.append(f"{variant}: no run scored")
            continue
        gaps = [r["sandbox_minus_pred_pct"] for r in ok]
        own = [r["sandbox_minus_computed_pct"] for r in ok if r.get("sandbox_minus_computed_pct") is not None]
        lines.append(f"{variant}: sandbox - predicted {float(np.median(gaps)):+.1f} % (runs: "
                     + ", ".join(f"{g:+.1f}" for g in gaps) + "; sandbox ms "
                     + ", ".join(f"{r['sandbox_ms']:.2f}" for r in ok) + f"; predicted {ok[0]['pred_rank_ms']:.2f})"
                     + (f"; sandbox - computed {float(np.median(own)):+.1f} % (runs: "
                        + ", ".join(f"{g:+.1f}" for g in own) + ")" if own else ""))
        cpu = [r["breakdown"]["compute_cpu_ms"] for r in ok if r["breakdown"].get("compute_cpu_ms") is not None]
        if cpu:
            lines.append(f"  compute: its own CPU time {float(np.median(cpu)):.2f} ms/it")
        kinds = sorted({k for r in ok for k in r["breakdown"].get("by_kind", {})})
        for k in kinds:
            vals = [r["breakdown"]["by_kind"][k] for r in ok if k in r["breakdown"].get("by_kind", {})]
            med = {f: float(np.median([v[f] for v in vals])) for f in ("n", "sandbox_ms", "pred_ms", "excess_ms")}
            lines.append(_kind_line(k, med))
    return lines


def report(res: dict) -> str:
    lines = [f"== {res['config']} (sandbox {res['sandbox']})"
             + (f", after with {res['env_after']}" if res.get("env_after") else "")]
    for variant in VARIANTS:
        for i, r in enumerate(res.get("runs", {}).get(variant) or [res[variant]]):
            name = run_name(variant, i)
            if r.get("error"):
                lines.append(f"{name}: FAILED {r['error']}")
                continue
            lines.append(f"{name}: sandbox {r['sandbox_ms']:.2f} ms, predicted {r['pred_rank_ms']:.2f} ms, "
                         f"sandbox - predicted {r.get('sandbox_minus_pred_pct', float('nan')):+.1f} %, "
                         f"sandbox - computed {r.get('sandbox_minus_computed_pct', float('nan')):+.1f} %, "
                         f"emulated job {r['job_ms']:.2f} ms, holds {r['transfer_holds']} ({r['transfer_hold_s']} s)")
            b = r["breakdown"]
            if r.get("threads_cpu_s"):
                lines.append("  threads' CPU s (whole run): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in sorted(r["threads_cpu_s"].items(), key=lambda kv: -kv[1])))
            if r.get("hops"):
                h = r["hops"]
                n, w = max(h["protocol_ops"], 1), max(h["waited_ops"], 1)
                lines.append(f"  protocol ops {h['protocol_ops']} (whole run): queue {1e3 * h['queue_s'] / n:.3f} ms, "
                             f"exchange {1e3 * h['exchange_s'] / n:.3f} ms an op; wake {1e3 * h['wake_s'] / w:.3f} ms "
                             f"an op waited on ({h['waited_ops']}); past the floor: data "
                             f"{1e3 * h.get('data_past_floor_s', 0) / n:.3f}, floor message "
                             f"{1e3 * h.get('floor_msg_past_floor_s', 0) / n:.3f} ms an op")
                if h.get("held_ops"):
                    lines.append(f"    holds {h['held_ops']}: the held thread ran again "
                                 f"{1e3 * h['hold_overshoot_s'] / h['held_ops']:.3f} ms an op past its floor")
                for k, (m, q, x, p) in sorted((h.get("by_op") or {}).items()):
                    lines.append(f"    {k:34} {m:4d} ops: queue {1e3 * q / m:.3f}, exchange {1e3 * x / m:.3f}, "
                                 f"data past the floor {1e3 * p / m:.3f} ms an op")
            if b.get("compute_cpu_ms") is not None:
                lines.append(f"  compute: its own CPU time {b['compute_cpu_ms']:.2f} ms/it")
            for k, v in (b.get("by_kind") or b["spent"]).items():
                if abs(v["excess_ms"]) >= 0.5:
                    lines.append(_kind_line(k, v))
            for k, v in b["late_ms"].items():
                lines.append(f"  late past the model: {k:30} {v['sum_ms']:7.2f} ms/it  median {v['median_ms']:.3f}  "
                             f"p90 {v['p90_ms']:.3f} ms")
    return "\n".join(lines + summary(res))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_hold", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help=f"a config name (any of {', '.join(fidelity.BY_NAME)})")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--base", type=Path, help="the other prism's tree (the 'before' variant)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--after", type=Path, help="the 'after' variant's tree (default: this one)")
    parser.add_argument("--devices", type=int, help="device slots P of the calibration (default: the config's)")
    parser.add_argument("--repeats", type=int, default=1, help="emulations per variant, interleaved")
    parser.add_argument("--sandbox", choices=("slice", "rank"), default="slice",
                        help="the default rank's whole slice (default) or that rank alone")
    parser.add_argument("--prepared", action="store_true", help="reuse the calibrated job in DIR/<config>")
    parser.add_argument("--env-after", nargs="+", default=[], metavar="K=V",
                        help="environment of the 'after' variant only")
    parser.add_argument("--rescore", type=Path, metavar="DIR/CONFIG")
    parser.add_argument("--show", type=Path, nargs="+", metavar="JSON", help="print saved hold.json files")
    args = parser.parse_args(argv)
    if args.show:
        for path in args.show:
            print(report(json.loads(path.read_text())), flush=True)
        return 0
    if args.rescore:
        old = json.loads((args.rescore / "hold.json").read_text())
        res = dict(old, **{v: score(args.rescore, v) for v in VARIANTS})
        if old.get("runs"):
            res["runs"] = {v: [score(args.rescore, run_name(v, i)) for i in range(len(old["runs"][v]))]
                           for v in VARIANTS}
    else:
        if args.config not in fidelity.BY_NAME or args.work is None or args.base is None:
            parser.error("--config NAME, --work DIR and --base TREE are needed (or --rescore DIR/CONFIG)")
        for flag, tree in (("--base", args.base), ("--after", args.after)):
            if tree is not None and not (tree / "prism" / "cli.py").is_file():
                parser.error(f"{flag} {tree}: not a prism tree (no prism/cli.py)")
        if args.repeats < 1 or (args.devices is not None and args.devices < 1):
            parser.error("--repeats and --devices take a positive count")
        try:
            env_after = parse_env(args.env_after)
        except ValueError as exc:
            parser.error(str(exc))
        try:
            res = run(fidelity.BY_NAME[args.config], args.work, args.base, args.steps, args.timeout, args.devices,
                      args.repeats, args.prepared, env_after, args.sandbox, args.after)
        except FileNotFoundError as exc:
            parser.error(str(exc))
    out = (args.rescore or args.work / res["config"]) / "hold.json"
    out.write_text(json.dumps(res, indent=1))
    print(report(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
