"""`prism bench capture`: capture of the reference workload at W ranks on P slots, and (`--pipeline`) the
stages after it: graph, slice plan (`--representative`), calibration.

Prints, per W: wall time, peak memory of the whole process tree (sum of the processes' PSS, sampled;
and the memory cgroup's peak where this machine lets us make one, which also counts /dev/shm and the
page cache of what was written), the ranks' private memory (median and largest, each rank's own
/proc/self/smaps_rollup at its end), context switches, events per second, graph bytes, payload bytes.
With `--pipeline`, per stage: wall, peak memory (capture: the tree's PSS; the others: the process's max
RSS), events/s, artifact bytes. A stage that fails leaves the numbers of the stages before it in its size's
row, with its name and one-line error (`size_stages.Stages`). `--budget S` skips a size whose time,
extrapolated from the sizes before it (`size_stages.extrapolated_s`), would not end within S seconds of the
start, and stops a stage still running at the end of S (said so in the table, never silently); `--json FILE`
writes every row, rewritten after every stage. The model is tiny: capture cost is about ranks and communication, not FLOPs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prism import job as job_files
from prism.bench.sampled_run import TreeMemory, emulate_once
from prism.bench.scale_tables import print_table, print_tables
from prism.bench.size_stages import Stages, _stage, extrapolated_s, folder_bytes, one_line, write_json  # noqa: F401 (_stage: tests)

LAYOUTS = {  # W -> (tp, pp, dp, ep)
    16: (2, 2, 4, 2),
    64: (2, 2, 16, 4),
    256: (2, 4, 32, 4),
    1024: (2, 4, 128, 8),
    2048: (4, 4, 128, 8),
    4096: (4, 8, 128, 8),
    # pp4, not pp8 (the example tp8·pp8·dp128·ep8): a rank's events grow with pp (pp layers, pp
    # microbatches: 594 a rank at pp4, 1,105 at pp8), and at the ~23k events/s of 16 slots (docs/benchmarks.md,
    # "Session 7") 8192 ranks of pp8 (~9 M events) need ~390 s for their steps alone, pp4 (~4.9 M) ~210 s
    8192: (8, 4, 256, 8),
}
CGROUP_V1 = Path("/sys/fs/cgroup/memory")
WARMUP = "prism.workloads.moe_gpt"  # preloaded: its `prism_warmup` runs once in the zygote


def workload_args(w: int, steps: int, layouts: dict | None = None) -> list[str]:
    return layout_args(*(layouts or LAYOUTS)[w], steps)


def layout_args(tp: int, pp: int, dp: int, ep: int, steps: int) -> list[str]:
    """The reference workload's arguments for a TP·PP·DP·EP layout (pp layers, pp microbatches, ep experts)."""
    heads = max(2, tp)  # divisible by tp; hidden 32 / heads stays an even head size up to tp 8
    return ["-m", "prism.workloads.moe_gpt", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--ep", str(ep),
            "--steps", str(steps), "--microbatches", str(pp), "--micro-batch-size", "1", "--seq-len", "16",
            "--hidden", "32", "--ffn-hidden", "32", "--heads", str(heads), "--kv-heads", str(heads),
            "--layers", str(pp), "--experts", str(ep), "--topk", "1", "--vocab", "64"]


def _cgroup() -> Path | None:
    """A fresh memory cgroup (v1) under ours, if this machine allows it."""
    try:
        mine = next(l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if ":memory:" in l)
        path = CGROUP_V1 / mine.lstrip("/") / f"prism-bench-{os.getpid()}"
        path.mkdir()
        return path
    except (OSError, StopIteration):
        return None


def layout_name(layout: tuple[int, int, int, int]) -> str:
    """A bench row's layout: (tp, pp, dp, ep) as tp2·pp2·dp4·ep2."""
    return "tp{}·pp{}·dp{}·ep{}".format(*layout)


def last_progress(log: Path) -> str:
    """The launcher's last `[prism]` line in a capture's log (its `--progress` line, every 30 s), else the
    log's last line (the ranks' own output shares the log); "" if there is none."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [l.strip() for l in tail.replace("\r", "\n").splitlines() if l.strip()]
    ours = [l for l in lines if l.startswith("[prism]")]
    return (ours or lines or [""])[-1][:300]


def _watch_capture(proc, w: int, devices: int, layouts: dict, start: float, timeout: float | None, sampler,
                   log: Path, save) -> dict:
    """Wait for the capture, saving a row of where it is every few seconds (elapsed, the tree's PSS peak so
    far, the capture's last progress line), so a call killed while the capture runs still says how far it
    got (session 12's W=8192 host call returned no row at all). Past `timeout` the row records the capture
    as stopped by the budget, is saved, and the launcher is stopped (it stops its ranks and removes its
    temporaries)."""
    period = 5.0 if w <= 1024 else 15.0
    row = {"W": w, "P": devices, "layout": layout_name(layouts[w]), "running": "capture"}
    while True:
        now = time.monotonic()
        wait = period if timeout is None else max(0.0, min(period, start + timeout - now))
        try:
            proc.wait(timeout=wait)
            return row
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.monotonic() - start
        row.update(elapsed_s=round(elapsed, 1), pss_peak_so_far=sampler.peak, capture_progress=last_progress(log))
        over = timeout is not None and elapsed >= timeout
        if over:
            row.update(failed_stage="capture", error=f"capture stopped: over the {timeout:.0f} s budget after "
                       f"{elapsed:.0f} s; its last progress: {row['capture_progress'] or '(none)'}")
            print(f"  W={w}: {row['error']}", file=sys.stderr, flush=True)
        if save is not None:
            save(dict(row))
        if over:
            proc.terminate()
            proc.wait()
            return row


def run_one(w: int, devices: int, steps: int, payloads: bool, work: Path, pipeline: bool = False,
            warmup: bool = True, timeout: float | None = None, emulate: bool = False, slices: bool = False,
            layouts: dict | None = None, save=None, keep_report: Path | None = None) -> dict:
    """One size: the capture (its failure raises: no stage ran), then the stages, each kept in the row
    whatever a later one does (`Stages`). `keep_report`: a folder to copy the size's report into (as
    report-wW.html) before its job is removed."""
    layouts = layouts or LAYOUTS
    job = work / f"w{w}"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(w), "--mode", "capture", "--devices",
           str(devices), "--out", str(job), "--force", "--progress"] + ([] if payloads else ["--no-payloads"]) \
        + (["--preload", WARMUP] if warmup else []) + workload_args(w, steps, layouts)
    cg = _cgroup()
    start = time.monotonic()
    log = open(work / f"w{w}-capture.log", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    if cg is not None:
        (cg / "cgroup.procs").write_text(str(proc.pid))
    sampler = TreeMemory(proc.pid, period=1.0 if w <= 256 else 3.0 if w <= 1024 else 10.0)
    sampler.start()
    watched = _watch_capture(proc, w, devices, layouts, start, timeout, sampler, work / f"w{w}-capture.log", save)
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.join()
    log.close()
    cg_peak = None
    if cg is not None:
        cg_peak = int((cg / "memory.max_usage_in_bytes").read_text())
        try:
            cg.rmdir()
        except OSError:
            pass
    if proc.returncode != 0:
        err = (work / f"w{w}-capture.log").read_text()
        where = watched.get("error") or (f"its last progress: {watched['capture_progress']}"
                                         if watched.get("capture_progress") else "")
        raise RuntimeError(f"capture at W={w} failed ({proc.returncode}) after {wall:.0f} s"
                           f"{'; ' + where if where else ''}, tree PSS peak {sampler.peak / 2**30:.1f} GiB:\n"
                           f"{err[-3000:]}")
    deadline = None if timeout is None else start + timeout

    def left() -> float | None:
        return None if deadline is None else deadline - time.monotonic()

    meta = json.loads(job_files.meta_path(job).read_text())
    cap = meta["capture"]
    row = {
        "W": w, "P": devices, "layout": layout_name(layouts[w]), "wall_s": wall,
        "pss_peak": sampler.peak, "cgroup_peak": cg_peak, "switches": cap["context_switches"],
        "raw_bytes": folder_bytes(job_files.raw_dir(job)), "payload_bytes": folder_bytes(job_files.payloads_dir(job)),
        "payload_files": len(list(job_files.payloads_dir(job).rglob("*.bin"))) if payloads else 0,
        "rank_private_mib_median": cap.get("rank_private_mib_median"),
        "rank_private_mib_max": cap.get("rank_private_mib_max"), "messages": cap.get("messages"),
        "rank_private_setup_mib_median": cap.get("rank_private_setup_mib_median"),
        "rank_private_setup_mib_max": cap.get("rank_private_setup_mib_max"),
        "rank_private_steps_mib_median": cap.get("rank_private_steps_mib_median"),
        "rank_private_max_rank": cap.get("rank_private_max_rank"),
        "warmup": warmup,
        # what bounds it: the coordinator's CPU seconds against its wall, the fork loop, packets vs messages
        "coordinator_cpu_s": cap.get("coordinator_cpu_s"), "coordinator_wall_s": cap.get("coordinator_wall_s"),
        "fork_s": cap.get("fork_s"), "fork_helpers": cap.get("fork_helpers"), "immortal": cap.get("immortal"),
        "heap_holes": cap.get("heap_holes"),
        # the ranks' own CPU seconds (their logical time) against P x the coordinator's wall: the slots' use
        "ranks_cpu_s": cap["logical_s_median"] * w if cap.get("logical_s_median") is not None else None,
        "switch_cost_us": cap.get("switch_cost_us"),
        # where the capture's wall went (meta's capture.phases_s), the ranks' CPU until their first wait, and the
        # slots' time held by a rank (against P x the coordinator's wall)
        "phases_s": cap.get("phases_s"), "setup_cpu_s": cap.get("setup_cpu_s"), "slot_held_s": cap.get("slot_held_s"),
    }
    stages = Stages(row, left, save)
    stages.save(row)
    try:
        _after_capture(job, devices, pipeline, emulate, slices, stages)
    finally:
        report = job_files.report(job)
        if keep_report is not None and report.is_file():
            keep_report.mkdir(parents=True, exist_ok=True)
            shutil.copy2(report, keep_report / f"report-w{w}.html")
        shutil.rmtree(job, ignore_errors=True)
    return row


def _after_capture(job: Path, devices: int, pipeline: bool, emulate: bool, slices: bool, stages: Stages) -> None:
    row, w, py = stages.row, stages.row["W"], sys.executable
    if not stages.run("graph", [py, "-m", "prism.cli", "graph", "--job", str(job)], f"graph at W={w}"):
        return
    import pyarrow.parquet as pq

    row["events"] = pq.ParquetFile(job_files.graph_file(job, "events")).metadata.num_rows
    row["events_per_s"] = row["events"] / row["wall_s"]
    row["graph_bytes"] = folder_bytes(job_files.graph_dir(job))
    stages.save(row)
    if not pipeline:
        return
    if stages.run("plan", [py, "-m", "prism.slices.plan", "--job", str(job), "--devices", str(devices),
                           "--representative"], f"plan at W={w}"):
        row["slices_bytes"] = folder_bytes(job_files.slices_dir(job))
    if stages.run("calibrate", [py, "-m", "prism.cli", "calibrate", "--job", str(job)], f"calibrate at W={w}"):
        row["calibrated_bytes"] = folder_bytes(job_files.calibrated_dir(job))
    if slices:  # the representative slices run, then the calibration from them (`scale_slices`)
        from prism.bench import scale_slices

        if not stages.failed:  # "calibrate" is then the calibration from the slices
            row["bare_calibrate_s"], row["bare_calibrate_rss"] = row.pop("calibrate_s"), row.pop("calibrate_rss")
        scale_slices.run(job, stages)
    if emulate and not stages.failed:
        try:
            em = emulate_once(job, None, 1, timeout=stages.left())
        except RuntimeError as exc:
            stages.fail("emulate", exc)
            row["emulate_error"] = row["error"]
        else:
            row.update({"emulate_s": em["wall_s"], "emulate_pss": em["pss_peak"], "emulate_startup_s": em["startup_s"],
                        "emulate_communicators": em["communicators"], "emulate_sandbox": em["sandbox"],
                        "emulate_iteration_s": em["iteration_s"],
                        "emulate_calibrated_iteration_s": em["calibrated_iteration_s"],
                        "emulation_bytes": folder_bytes(job_files.emulation(job))})
            stages.save(row)
    if slices:
        from prism.bench import scale_slices

        scale_slices.after_emulate(job, stages)


def memory_short(w: int, done: list[dict], available=None) -> str | None:
    """Why a capture of W ranks will not fit in this machine's memory, from the private MiB a rank measured at
    the largest W already run (the launcher's own check assumes less, to refuse only what surely cannot fit);
    None when it fits or nothing was measured yet."""
    measured = [r for r in done if r.get("rank_private_mib_max")]
    if not measured:
        return None
    last = max(measured, key=lambda r: r["W"])
    if available is None:
        from prism.runtime.launch.limits import available_memory

        available = available_memory()[0]
    # the ranks' private memory at the rate measured (its largest rank), the zygote and coordinator as measured
    # (tree PSS beyond the ranks' share), and the page cache of what the capture writes
    per_rank = last["rank_private_mib_max"] * 2**20
    rest = max(0, last["pss_peak"] - last["W"] * last["rank_private_mib_median"] * 2**20)
    need = w * per_rank + rest + (last["raw_bytes"] + last["payload_bytes"]) * w / last["W"]
    if need <= available:
        return None
    return (f"needs ~{need / 2**30:.1f} GiB ({last['rank_private_mib_max']:.1f} MiB a rank as measured at "
            f"W={last['W']}, the zygote and what it writes), only {available / 2**30:.1f} GiB available: not "
            "started (a machine with more memory, or fewer ranks)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated W values, run in this order")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-payloads", action="store_true")
    parser.add_argument("--no-warmup", action="store_true", help="no workload warm-up in the zygote")
    parser.add_argument("--pipeline", action="store_true", help="also time the slice plan and calibration")
    parser.add_argument("--emulate", action="store_true",
                        help="with --pipeline: also time `prism emulate` of one sandbox rank (the default SPEC)")
    parser.add_argument("--slices", action="store_true",
                        help="with --pipeline: run the representative slices and calibrate from them, then (with "
                             "--emulate) emulate, summary and report (prism.bench.scale_slices)")
    parser.add_argument("--weak", action="store_true",
                        help="weak-scaling layouts tp2·pp2·ep2·dp(W/4): a rank's work fixed, DP grows with W")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: skip a size whose extrapolated capture would not end in time")
    parser.add_argument("--json", type=Path, help="write the rows to this file (after each size)")
    parser.add_argument("--out", type=Path, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--keep-report", type=Path, metavar="DIR",
                        help="copy each size's report (with --slices --emulate) to DIR/report-wW.html")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from prism.bench.scale_slices import WEAK

    layouts = WEAK if args.weak else LAYOUTS
    bad = [s for s in sizes if s not in layouts]
    if bad:
        print(f"prism bench capture: no layout for W={bad}; choose from {sorted(layouts)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="prism-bench-capture-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    began = time.monotonic()
    for w in sizes:
        done = [r for r in rows if not r.get("skipped")]
        left = None if args.budget is None else args.budget - (time.monotonic() - began)
        guess = extrapolated_s(w, done)
        if left is not None and guess is not None and guess[0] > left:
            rows.append({"W": w, "skipped": f"extrapolated {guess[0]:.0f} s ({guess[1]}) > {left:.0f} s left of "
                                             "the budget"})
            print(f"  W={w}: {rows[-1]['skipped']}", file=sys.stderr, flush=True)
            continue
        too_big = memory_short(w, done)
        if too_big:
            rows.append({"W": w, "skipped": too_big})
            print(f"  W={w}: {too_big}", file=sys.stderr, flush=True)
            continue
        print(f"  W={w} ...", file=sys.stderr, flush=True)

        def save(row: dict, done: list[dict] = list(rows)) -> None:  # the rows so far and this size's stages
            if args.json:
                write_json(args.json, done + [row])

        try:
            rows.append(run_one(w, args.devices, args.steps, not args.no_payloads, work, args.pipeline,
                                not args.no_warmup, timeout=left, emulate=args.emulate, slices=args.slices,
                                layouts=layouts, save=save, keep_report=args.keep_report))
        except RuntimeError as exc:
            rows.append({"W": w, "skipped": one_line(exc), "failed_stage": "capture"})
            print(f"  W={w}: {exc}", file=sys.stderr, flush=True)
        if args.json:
            write_json(args.json, rows)
        print_table(rows, args)
        print_tables(rows)
    if rows and rows[-1].get("skipped"):
        print_table(rows, args)
        print_tables(rows)
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if any(not r.get("skipped") and not r.get("failed_stage") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
