"""`prism bench emulate`: hybrid emulation of one sandbox rank at W in {16, 64, 256, 1024} captured on P=2.

For each W: capture the reference workload (the layouts of `prism bench capture`) on P slots, build the
graph, calibrate (bare graph), then time ``prism emulate --sandbox SPEC --devices P``. Prints, per W:
start-up s (the replay worker's, from its start to the common start t0, from ``emulation/meta.json``),
peak memory of the whole emulation (summed PSS of its process tree, sampled, as `prism bench capture`
measures it), communicators created, wall time per emulated iteration (the sandbox's measured iteration
time, median over iterations >= 1) beside the calibrated prediction for that rank, the dependency cone
(virtual events driven live / all virtual events), the most the virtual clock was late at a real op
(how long the simulator, not the modelled job, made the sandbox wait) and the emulation's wall time.
Group reduction shows as start-up, memory and communicators flat in W. ``--json OUT`` also writes the
rows (and the host's load) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prism import job as job_files
from prism.bench import text_table
from prism.bench.capture_scale import LAYOUTS, layout_name, workload_args
from prism.bench.sampled_run import emulate_once


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def prepare(w: int, devices: int, steps: int, work: Path) -> Path:
    """A captured, graphed and calibrated job of the reference workload at W."""
    job = work / f"w{w}"
    prism = [sys.executable, "-m", "prism.cli"]
    _run(prism + ["launch", "--nproc", str(w), "--mode", "capture", "--devices", str(devices), "--out", str(job)]
         + workload_args(w, steps), f"capture at W={w}")
    _run(prism + ["graph", "--job", str(job)], f"graph at W={w}")
    _run(prism + ["calibrate", "--job", str(job)], f"calibrate at W={w}")
    return job


def synthetic(w: int, work: Path, iterations: int = 2) -> dict:
    """The timed replay alone on a synthetic calibrated job of W ranks (`calibrate.synthetic.training_graph`,
    ~2000 events a rank; no capture, so W=1024 and beyond fit this box): the cone of one sandbox rank (tp=0,
    dp=0 of the last stage), the replay's set-up time, and the kernel time to drive the cone with every
    real op completing at its calibrated time. Also checks that the virtual arrivals at every real op are
    then exactly the calibrated ones (the clock adds no wait of its own)."""
    import numpy as np

    from prism import schemas
    from prism.calibrate.arrays import KINDS
    from prism.calibrate.sweep import discover
    from prism.calibrate.synthetic import layout_for, training_graph
    from prism.runtime.replay.cone import ARRIVE, ARRIVE_RECV
    from prism.runtime.replay.clock import TimedReplay

    layout = layout_for(w)
    layout = type(layout)(**{**layout.__dict__, "iterations": iterations})
    syn = training_graph(layout, labels=False)
    g = syn.graph
    _, tl = discover(g, syn.durations, syn.transfer)
    n = g.n_events
    rank = np.repeat(np.arange(w, dtype=np.int32), np.diff(g.rank_ptr))
    folder = work / f"synthetic-w{w}"
    job_files.graph_dir(folder).mkdir(parents=True, exist_ok=True)
    job_files.calibrated_dir(folder).mkdir(parents=True, exist_ok=True)
    ids = np.arange(n, dtype=np.int64)
    seq = ids - g.rank_ptr[rank]
    pq.write_table(pa.table({
        "event_id": ids, "rank": rank, "seq": seq,
        "kind": pa.array(np.asarray(KINDS, dtype=object)[g.kind], pa.string()).dictionary_encode(),
        "comm_id": g.comm, "op_event_id": g.wait_op, "iteration": np.zeros(n, dtype=np.int32),
        "group_name": pa.nulls(n, pa.string()), "group_seq": np.full(n, -1, dtype=np.int64),  # (names: not needed)
        "peer": np.full(n, -1, dtype=np.int32), "tag": np.zeros(n, dtype=np.int32)}),
        job_files.graph_file(folder, "events"))
    pq.write_table(pa.table({"rank": rank, "seq": seq, "event_id": ids, "start_ns": tl.start_ns,
                             "end_ns": tl.end_ns}, schema=schemas.TIMELINE), job_files.calibrated(folder, "timeline"))
    sandbox = (layout.pp - 1) * layout.tp * layout.dp
    replay = TimedReplay(job_files.graph_file(folder, "events"), job_files.calibrated(folder, "timeline"), {sandbox})
    job = replay.job
    real = [int(c) for c in job.comm_ids[replay.driven_mask]]
    # a real comm completes when its first member sees it: the cone's completion (`prism.clock_rule`: a wait
    # ends its own time after the completion; a bare graph's waits have their CPU time as own time)
    waits = np.flatnonzero((g.kind == KINDS.index("wait")) & (g.wait_op >= 0))
    seen = np.full(g.n_comms, np.iinfo(np.int64).max, dtype=np.int64)
    on = g.comm[g.wait_op[waits]]
    blocking = (on >= 0) & (g.kind[g.wait_op[waits]] != KINDS.index("send"))
    np.minimum.at(seen, on[blocking], tl.end_ns[waits[blocking]])
    replay.simulate({c: int(seen[c]) if seen[c] != np.iinfo(np.int64).max else int(tl.comm_end_ns[c]) for c in real})
    issue = (job.code >= ARRIVE) & (job.code <= ARRIVE_RECV) & job.virtual
    want = np.full(len(job.comm_ids), -(2**62), dtype=np.int64)
    np.maximum.at(want, job.comm[issue], job.start[issue])
    wrong = [c for c in real if replay.arrival(c) != want[replay.index[c]]]
    live, total = job.cone_size
    shutil.rmtree(folder, ignore_errors=True)
    iteration_ns = float(tl.end_ns.max()) / iterations
    return {"W": w, "layout": f"tp{layout.tp}·pp{layout.pp}·dp{layout.dp}·ep{layout.ep}", "sandbox": sandbox,
            "events": n, "cone_live_events": live, "virtual_events": total, "real_comms": len(real),
            "setup_s": replay.setup_s, "setup_cpu_s": replay.setup_cpu_s, "kernel_s": replay.kernel_s,
            "kernel_s_per_iteration": replay.kernel_s / iterations, "kernel_cpu_s": replay.kernel_cpu_s,
            "kernel_cpu_s_per_iteration": replay.kernel_cpu_s / iterations,
            "modelled_iteration_s": iteration_ns / 1e9, "arrivals_off_calibrated": len(wrong)}


SYNTHETIC_COLUMNS: list[text_table.Column] = [
    ("W", ">5", lambda r: r["W"]), ("layout", "<18", lambda r: r["layout"]), ("events", ">10,", lambda r: r["events"]),
    ("cone (live/virtual)", ">26", lambda r: _cone(r)), ("real ops", ">8", lambda r: r["real_comms"]),
    ("set-up s", "8.2f", lambda r: r["setup_s"]), ("(CPU s)", "7.2f", lambda r: r["setup_cpu_s"]),
    ("kernel ms/iter", "14.2f", lambda r: 1e3 * r["kernel_s_per_iteration"]),
    ("(CPU ms)", "8.2f", lambda r: 1e3 * r["kernel_cpu_s_per_iteration"]),
    ("modelled ms/iter", "16.2f", lambda r: 1e3 * r["modelled_iteration_s"]),
    ("arrivals off", ">12", lambda r: r["arrivals_off_calibrated"]),
]


def synthetic_table(rows: list[dict]) -> str:
    return text_table.render("prism bench emulate --synthetic: the timed replay alone (no capture), one sandbox rank",
                             SYNTHETIC_COLUMNS, rows)


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _cone(r: dict) -> str:
    live, total = r.get("cone_live_events"), r.get("virtual_events")
    if live is None or not total:
        return "n/a"
    return f"{live}/{total} ({100 * live / total:.0f}%)"


def _prefetch(r: dict) -> str:
    """The replay worker's payload pool: size, stalls (a replay op waited on its payload), peak bytes."""
    pf = r.get("prefetch")
    if not pf:
        return "n/a"
    return f"{pf.get('prefetch_mb')} MiB: {pf.get('stalls')} stalls, peak {pf.get('peak_bytes', 0) / 2**20:.1f} MiB"


def table(rows: list[dict], devices: int, steps: int) -> str:
    gib = 2**30
    lines = [f"prism bench emulate: one sandbox rank, P={devices}, {steps} steps, tiny MoE model",
             f"{'W':>5} {'layout':<18} {'sandbox':>7} {'start-up s':>10} {'PSS peak':>9} {'communicators':>13} "
             f"{'s/iteration':>11} {'calibrated':>10} {'cone (live/virtual)':>22} {'late ms':>8} {'wall s':>7}"
             f"  prefetch pool"]
    for r in rows:
        layout = layout_name(LAYOUTS[r["W"]]) if r["W"] in LAYOUTS else "?"
        lines.append(f"{r['W']:>5} {layout:<18} {r['sandbox']:>7} {_fmt(r['startup_s'], '10.2f')} "
                     f"{r['pss_peak'] / gib:8.2f}G {_fmt(r['communicators'], '>13')} "
                     f"{_fmt(r['iteration_s'], '11.3f')} {_fmt(r.get('calibrated_iteration_s'), '10.3f')} "
                     f"{_cone(r):>22} {_fmt(r.get('gate_late_max_ms'), '8.1f')} {r['wall_s']:7.1f}  {_prefetch(r)}")
    return "\n".join(lines)


def _host() -> dict:
    load = os.getloadavg()
    return {"hostname": platform.node(), "cores": len(os.sched_getaffinity(0)), "loadavg": list(load),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench emulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated W values")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sandbox", help="SPEC (default: the stage's, one rank of the last pipeline stage)")
    parser.add_argument("--out", type=Path, help="folder for the jobs (default: a temporary one, removed)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                        help="print the tables of JSON files written by --json, run nothing")
    parser.add_argument("--reuse", action="store_true",
                        help="with --out: emulate the calibrated jobs a previous run left there again (no capture)")
    parser.add_argument("--prefetch-mb", default=None, metavar="N[,N...]",
                        help="emulate each job once per payload-pool size in MiB (0: prefetch off); "
                             "default: the emulate stage's default once")
    parser.add_argument("--synthetic", action="store_true",
                        help="time the timed replay alone on synthetic calibrated jobs (powers of two; no capture)")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        print(f"prism bench emulate: --sizes {args.sizes!r}: comma-separated numbers", file=sys.stderr)
        return 2
    if args.summarize:
        return summarize(args.summarize)
    if args.synthetic:
        return _main_synthetic(args, sizes, argv)
    if args.reuse and args.out is None:
        print("prism bench emulate: --reuse needs --out DIR (the folder of a previous run)", file=sys.stderr)
        return 2
    try:
        pools = [None] if args.prefetch_mb is None else [int(m) for m in args.prefetch_mb.split(",")]
    except ValueError:
        print(f"prism bench emulate: --prefetch-mb {args.prefetch_mb!r}: comma-separated MiB values", file=sys.stderr)
        return 2
    bad = [s for s in sizes if s not in LAYOUTS]
    if bad:
        print(f"prism bench emulate: no layout for W={bad}; choose from {sorted(LAYOUTS)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="prism-bench-emulate-"))
    rows = []
    try:
        for w in sizes:
            job = work / f"w{w}"
            if args.reuse and job_files.calibrated(job, "timeline").is_file():
                print(f"  W={w}: reusing the calibrated job {job}", file=sys.stderr, flush=True)
            else:
                print(f"  W={w}: capture, graph, calibrate ...", file=sys.stderr, flush=True)
                job = prepare(w, args.devices, args.steps, work)
            for pool in pools:
                print(f"  W={w}: emulate{'' if pool is None else f' (prefetch {pool} MiB)'} ...",
                      file=sys.stderr, flush=True)
                extra = [] if pool is None else ["--prefetch-mb", str(pool)]
                row = dict(emulate_once(job, args.sandbox, args.devices, extra),
                           layout=layout_name(LAYOUTS[w]), host=_host())
                rows.append(row)
                print("  " + json.dumps(row), file=sys.stderr, flush=True)
            if args.out is None:
                shutil.rmtree(job, ignore_errors=True)  # (a W=1024 job is large: one at a time)
    except RuntimeError as exc:
        print(f"prism bench emulate: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)
        if args.json is not None and rows:
            _write_json(args.json, argv, {"devices": args.devices, "steps": args.steps, "rows": rows})
    print()
    print(table(rows, args.devices, args.steps))
    return 0


def summarize(paths: list[Path]) -> int:
    """The tables of saved runs (``--json``), each under the command that made it."""
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            rows = doc["rows"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"prism bench emulate --summarize: {path}: not a --json file of this bench ({exc})",
                  file=sys.stderr)
            return 2
        loads = sorted({round(r["host"]["loadavg"][0], 1) for r in rows if "host" in r})
        print(f"{path}: {doc.get('command')} (1-min load average during the rows: {loads})")
        print(synthetic_table(rows) if doc.get("synthetic") else table(rows, doc.get("devices"), doc.get("steps")))
        print()
    return 0


def _write_json(path: Path, argv, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"command": "prism bench emulate " + " ".join(argv if argv is not None else sys.argv[1:]),
                               **payload}, indent=2) + "\n")
    tmp.replace(path)


def _main_synthetic(args, sizes: list[int], argv) -> int:
    bad = [s for s in sizes if s < 4 or s & (s - 1)]
    if bad:
        print(f"prism bench emulate --synthetic: W={bad}: powers of two >= 4", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="prism-bench-emulate-syn-"))
    rows = []
    try:
        for w in sizes:
            print(f"  W={w}: synthetic job, timed replay ...", file=sys.stderr, flush=True)
            rows.append(dict(synthetic(w, work, args.steps), host=_host()))
            print("  " + json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.json is not None and rows:
            _write_json(args.json, argv, {"synthetic": True, "steps": args.steps, "rows": rows})
    print()
    print(synthetic_table(rows))
    return 0 if all(r["arrivals_off_calibrated"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
