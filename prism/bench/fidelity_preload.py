"""What a slice rank's loading of captured results costs its own core: the same slice runs with the results loaded
during the run (`PRISM_SLICE_PRELOAD_MB=0`, the rule before session 10) and before it (the default), alternated.

    python -m prism.bench.fidelity_preload --work DIR [--config dp8-var] [--devices 2] [--steps 8] [--repeats 2]
        [--preload 0,1024] [--untimed] [--report]
    python -m prism.bench.fidelity_preload --held CAPTURE_DIR    what a slice rank of each rank would hold loaded

Prepares DIR once (capture on P device slots, graph, plan, the untimed slices and their calibration:
`fidelity.run_prism`, one pass, no emulation), then runs every measured slice with `prism launch --mode slice`
(pinned, timed by DIR/calibrated/timeline.parquet unless --untimed) once per preload setting and repeat, and prints
per slice rank: the captured results it loaded before and during the run (MB per rank-iteration: per step of the program), the CPU time of
its loader thread during the run (`prism-results`, from `slice_results.json`: `thread_cpu.by_thread` at the rank's
end, and the loader's own `time.thread_time`), and what its compute events of iterations >= 1 measured: CPU time and
wall span minus CPU time, ms per rank-iteration (the stretch the timed pass counts as compute). CPU times are
per-thread clocks, not wall times: they do not depend on the box's load the way the spans do.

Analysis only: nothing here feeds a prediction.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism import artifacts, schemas, settings
from prism import job as job_files
from prism.bench.fidelity import BY_NAME, MODEL, WORKLOAD, _prism, _run, run_prism

KNOB = settings.SLICE_PRELOAD_MB.name


def prepare(work: Path, config: str, devices: int, steps: int, timeout: float) -> None:
    cfg = BY_NAME[config]
    if job_files.calibrated(work).is_file():
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run_prism(cfg, cfg.args(steps, MODEL), devices, work, work / "log.txt", timeout, emulate=False, passes=1)


def slices(work: Path) -> dict[int, list[int]]:
    plan = artifacts.read_parquet(job_files.slice_plan(work)).to_pylist()
    out: dict[int, list[int]] = {}
    for r in plan:
        if r["measured"]:
            out.setdefault(r["slice"], []).append(r["rank"])
    return {k: sorted(v) for k, v in sorted(out.items())}


def run_slice(work: Path, config: str, steps: int, ranks: list[int], out: Path, preload_mb: float, timed: bool,
              timeout: float) -> None:
    cfg = BY_NAME[config]
    shutil.rmtree(out, ignore_errors=True)
    env_before = os.environ.get(KNOB)
    os.environ[KNOB] = str(preload_mb)
    try:
        _run(_prism("launch", "--nproc", str(cfg.world), "--mode", "slice", "--pin", "--slice-ranks",
                    ",".join(map(str, ranks)), "--capture", str(job_files.capture_dir(work)), "--out", str(out),
                    *(("--timed-by", str(job_files.calibrated(work))) if timed else ()),
                    *WORKLOAD, *cfg.args(steps, MODEL)), work / "log.txt", timeout)
    finally:
        if env_before is None:
            os.environ.pop(KNOB, None)
        else:
            os.environ[KNOB] = env_before


def whole_iterations(it: np.ndarray) -> np.ndarray:
    """The iterations that are steps of the program: not the few events after the last step's end (a tail
    iteration of a handful of events)."""
    values, counts = np.unique(it[it >= 0], return_counts=True)
    return values[counts * 2 >= counts.max()]


def rank_row(run: Path, rank: int) -> dict:
    """One slice rank's numbers (per rank-iteration: iterations >= 1 of its events) from the slice run's folder."""
    stats = json.loads(job_files.rank_stream(run, rank, "slice_results.json").read_text())
    ev = artifacts.read_raw_stream(job_files.rank_stream(run, rank), schemas.RAW_EVENTS)
    kind = ev["kind"].cast(pa.string()) if pa.types.is_dictionary(ev["kind"].type) else ev["kind"]
    it = ev["iteration"].to_numpy()
    steps = whole_iterations(it)
    sel = pc.equal(kind, schemas.KIND_COMPUTE).to_numpy(zero_copy_only=False) & np.isin(it, steps[1:])
    n_it = max(len(steps) - 1, 1)  # iterations >= 1
    n_all = max(len(steps), 1)  # every step: what was loaded, over the run
    wall = (ev["t_end_ns"].to_numpy() - ev["t_start_ns"].to_numpy())[sel].sum()
    cpu = ev["cpu_ns"].to_numpy()[sel].sum()
    threads = stats.get("threads_cpu_s", {})
    return {
        "rank": rank, "results_mb_it": stats["bytes"] / 1e6 / n_all,
        "before_mb_it": stats["preloaded_bytes"] / 1e6 / n_all, "during_mb_it": stats["during_run_bytes"] / 1e6 / n_all,
        "preload_s": stats["preload_wall_s"], "held_mb": stats["preloaded_bytes"] / 1e6,
        "loader_cpu_ms_it": 1e3 * threads.get("prism-results", 0.0) / n_all,
        "loader_own_cpu_ms_it": 1e3 * stats["during_run_cpu_s"] / n_all,
        "compute_cpu_ms_it": cpu / 1e6 / n_it, "stretch_ms_it": (wall - cpu) / 1e6 / n_it,
    }


HEAD = ("| preload MB | repeat | slice | rank | results MB/it | loaded before run MB/it | loaded during run MB/it | "
        "loader thread CPU during run ms/it (by_thread / own clock) | compute CPU ms/it | compute wall - CPU ms/it |")


def fmt(preload: float, rep: int, k: int, r: dict) -> str:
    return (f"| {preload:g} | {rep} | {k} | {r['rank']} | {r['results_mb_it']:.2f} | {r['before_mb_it']:.2f} | "
            f"{r['during_mb_it']:.2f} | {r['loader_cpu_ms_it']:.1f} / {r['loader_own_cpu_ms_it']:.1f} | "
            f"{r['compute_cpu_ms_it']:.1f} | {r['stretch_ms_it']:+.2f} |")


def held(capture: Path) -> list[str]:
    """Per rank of a capture: its captured results (payload index rows of role 'out') and their payload files'
    bytes: what the rank holds loaded before a slice run's program runs (PRISM_SLICE_PRELOAD_MB permitting)."""
    lines, sizes = [], []
    for folder in sorted(job_files.raw_dir(capture).glob("rank=*"), key=lambda p: int(p.name.split("=")[1])):
        with pa.OSFile(str(job_files.stream_file(folder, "payloads"))) as source:
            rows = pa.ipc.open_stream(source).read_all().to_pylist()
        outs = [r for r in rows if r["role"] == "out"]
        payloads = job_files.payloads_dir(capture)
        size = sum(os.path.getsize(payloads / r["hash"][:2] / f"{r['hash']}.bin") for r in outs)
        sizes.append(size)
        lines.append(f"{folder.name}: {len(outs)} results, {size / 1e6:.1f} MB of payload files")
    lines.append(f"max {max(sizes, default=0) / 1e6:.1f} MB per rank, {sum(sizes) / 1e6:.1f} MB over the {len(sizes)} ranks")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_preload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="the job folder (prepared once, then reused)")
    parser.add_argument("--held", type=Path, metavar="CAPTURE_DIR", help="run nothing: per rank of this capture, the "
                        "captured results a slice rank loads before the run (MB)")
    parser.add_argument("--config", default="dp8-var", choices=sorted(BY_NAME))
    parser.add_argument("--devices", type=int, default=2, help="device slots P (the slices' size)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each slice per preload setting (alternated)")
    parser.add_argument("--preload", default="0,1024", help="PRISM_SLICE_PRELOAD_MB values, comma-separated")
    parser.add_argument("--untimed", action="store_true", help="untimed slice runs (default: timed by the "
                        "untimed pass's calibration, the pass whose compute is the wall span)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--report", action="store_true", help="run nothing: the tables of the runs saved in "
                        "WORK/preload-runs by an earlier call with the same --preload and --repeats")
    args = parser.parse_args(argv)
    if args.held:
        print("\n".join(held(args.held)))
        return 0
    if args.work is None:
        parser.error("--work is required (or --held CAPTURE_DIR)")
    if not args.report:
        prepare(args.work, args.config, args.devices, args.steps, args.timeout)
    settings_ = [float(x) for x in args.preload.split(",")]
    print(f"{args.config}, P={args.devices}, {args.steps} steps, {'untimed' if args.untimed else 'timed'} slice runs; "
          f"per rank-iteration ('/it'); work {args.work}\n\n{HEAD}\n" + "|---" * 10 + "|", flush=True)
    sums: dict[float, list[dict]] = {p: [] for p in settings_}
    servers: list[tuple] = []
    for rep in range(args.repeats):
        for preload in settings_:
            for k, ranks in slices(args.work).items():
                out = args.work / "preload-runs" / f"p{preload:g}-r{rep}-s{k}"
                if not args.report:
                    run_slice(args.work, args.config, args.steps, ranks, out, preload, not args.untimed, args.timeout)
                for rank in ranks:
                    row = rank_row(out, rank)
                    sums[preload].append(row)
                    print(fmt(preload, rep, k, row), flush=True)
                servers.append((preload, rep, k, ranks, server_row(out, ranks)))
    print("\nmean over slice ranks and repeats:\n\n| preload MB | rank-runs | loaded during run MB/it | loader CPU "
          "during run ms/it | compute CPU ms/it | compute wall - CPU ms/it | held before run, MB per rank (max) |\n"
          "|---|---|---|---|---|---|---|")
    for preload, rows in sums.items():
        m = {k: float(np.mean([r[k] for r in rows])) for k in rows[0] if k != "rank"}
        print(f"| {preload:g} | {len(rows)} | {m['during_mb_it']:.2f} | {m['loader_cpu_ms_it']:.1f} | "
              f"{m['compute_cpu_ms_it']:.1f} | {m['stretch_ms_it']:+.2f} | {max(r['held_mb'] for r in rows):.1f} |")
    print("\nthe replay server of each slice run (`meta.json` replay: its process CPU time over its wall time from "
          "its start to the end of its replay; its cores beside the slice ranks'):\n\n| preload MB | repeat | slice "
          "| server CPU s | server wall s | CPU / wall | server threads' CPU s (largest 3) | server cores | slice "
          "ranks' cores |\n|---|---|---|---|---|---|---|---|---|")
    for preload, rep, k, ranks, s in servers:
        top = ", ".join(f"{n} {v:.1f}" for n, v in sorted(s["threads"].items(), key=lambda x: -x[1])[:3])
        print(f"| {preload:g} | {rep} | {k} | {s['cpu_s']:.1f} | {s['wall_s']:.1f} | {s['cpu_s'] / s['wall_s']:.2f} | "
              f"{top} | {s['cores']} | {s['rank_cores']} |")
    return 0


def server_row(run: Path, ranks: list[int]) -> dict:
    replay = json.loads(job_files.meta_path(run).read_text()).get("replay", {})
    results = [json.loads(job_files.rank_stream(run, r, "slice_results.json").read_text()) for r in ranks]
    cores = sorted({c for stats in results for c in stats.get("rank_cores", [])})
    return {"cpu_s": replay.get("cpu_s", float("nan")), "wall_s": replay.get("wall_s", float("nan")),
            "threads": replay.get("threads_cpu_s", {}), "cores": replay.get("cores", "?"), "rank_cores": cores}


if __name__ == "__main__":
    sys.exit(main())
