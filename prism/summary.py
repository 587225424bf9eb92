"""Summary stage: a short text summary of a job's graph (iteration time, communication, memory).

    prism summary --job DIR          writes DIR/summary.txt, prints the summary
    prism summary --job DIR --show   prints an existing summary and where the artifacts are

Iteration time: iteration k of the job ends when its last rank's ``iteration_end`` marker ends; the job's
iteration time is the gap between consecutive such ends, iteration 0 (warm-up, start-up) left out: one
definition, `prism/iterations.py`, shared with `prism calibrate` and `prism bench fidelity`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

import duckdb

from prism import folder_lock
from prism import job as job_files
from prism import artifacts
from prism.iterations import iteration_times
from prism.runtime import modes

ITERATIONS_SQL = """
-- per rank and iteration: when the optimizer step ended, and the time since the previous one
WITH ends AS (
  SELECT rank, iteration, t_end_ns AS t_end
  FROM events WHERE kind = 'marker' AND op = 'iteration_end'
)
SELECT rank, iteration, t_end,
       t_end - lag(t_end) OVER (PARTITION BY rank ORDER BY iteration) AS dur_ns
FROM ends
"""


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.2f} ms"


def _mib(b) -> str:
    return "n/a" if b is None or b < 0 else f"{b / 2**20:.1f} MiB"


def oom_lines(job_dir: Path) -> list[str]:
    """A run that ran out of device memory (`OUT/oom.json`, prism/runtime/oom.py): the finding, plainly."""
    path = next((p for p in (job_dir / "oom.json", job_files.capture_dir(job_dir) / "oom.json") if p.is_file()), None)
    if path is None:
        return []
    found = json.loads(path.read_text())
    lines = [f"FINDING: the program ran out of device memory ({found['mode']} of {found['world_size']} ranks; "
             f"exit code {found['exit_code']}; {path}):"]
    for r in found["ooms"]:
        size, limit = r.get("requested_bytes"), r.get("limit_bytes")
        lines.append(f"  rank {r['rank']}: iteration {r['iteration']}, microbatch {r['microbatch']} "
                     f"(after {r['phase']}), asked for {'?' if size is None else f'{size:,}'} bytes"
                     + (f" with {r['reserved_bytes']:,} reserved" if r.get("reserved_bytes") is not None else "")
                     + (f", limit {limit:,} bytes per rank" if limit else ""))
    lines.append("This is a result about the program at this memory limit, not a failure of prism: the job "
                 "does not fit; the stages after capture have nothing to run.")
    return lines


def summarize(job_dir: Path) -> str:
    oom = oom_lines(job_dir)
    if oom and not job_files.graph_file(job_dir, "events").is_file():
        return "\n".join([f"prism summary of {job_dir}", ""] + oom) + "\n"
    con = duckdb.connect()
    graph = job_files.graph_dir(job_dir)
    for name in ("events", "comms", "groups", "ranks"):
        path = job_files.graph_file(job_dir, name)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the graph stage first (prism graph "
                                    f"--job {job_dir})")
        con.read_parquet(str(path)).create_view(name)  # the path is a value, never pasted into SQL
    meta_path = next((p for p in (job_files.meta_path(job_dir), job_files.meta_path(job_files.capture_dir(job_dir)))
                      if p.is_file()), None)
    inputs = [job_files.graph_file(job_dir, name) for name in ("events", "comms", "groups", "ranks")]
    inputs += [p for p in (job_files.calibrated(job_dir, "iterations"),) if p.is_file()]
    for path in inputs:  # a corrupt page is named here, not deep inside a DuckDB query
        artifacts.check_version(path)
        artifacts.verify_parquet(path)
    artifacts.same_run(inputs + ([meta_path] if meta_path else []))
    meta = json.loads(meta_path.read_text()) if meta_path else {}
    world = con.execute("SELECT count(*) FROM ranks").fetchone()[0]
    coords = con.execute(
        "SELECT max(tp)+1, max(pp)+1, max(dp)+1, max(ep)+1, max(iterations) FROM ranks").fetchone()
    n_events = con.execute("SELECT count(*) FROM events").fetchone()[0]
    lines = [f"prism summary of {job_dir}", ""] + oom
    dims = ", ".join(f"{n}={v}" for n, v in zip(("TP", "PP", "DP", "EP"), coords[:4]) if v and v > 0)
    lines.append(f"ranks: {world} ({dims or 'no parallel dimensions named'}), iterations: {coords[4]}, "
                 f"events: {n_events:,}, mode: {meta.get('mode', '?')}, device: {meta.get('device', '?')}")
    rules = con.execute("SELECT iteration_rule, microbatch_rule, min(iterations), max(iterations), count(*) "
                        "FROM ranks GROUP BY ALL ORDER BY ALL").fetchall()
    for it_rule, mb_rule, lo, hi, n in rules:
        each = f"{lo}" if lo == hi else f"{lo}..{hi}"
        lines.append(f"boundaries: {each} iterations on each of {n} ranks, by rule '{it_rule}' "
                     f"(microbatches: '{mb_rule}')")
    cores = meta.get("cores")
    if cores is not None and world > cores and not modes.captured(meta):
        lines.append(f"NOTE: {world} ranks ran on {cores} cores (oversubscribed): these timings are a real "
                     f"run of this machine, not the ground truth of {world} devices.")
    elif meta.get("pin"):
        lines.append(f"ranks pinned one per core ({cores} cores), one intra-op thread each.")

    if modes.captured(meta):
        lines += _capture_lines(con, meta, job_dir)
    else:
        lines += _timing_lines(con)
    mem = con.execute("""
        SELECT max(mem_peak_bytes), min(CASE WHEN mem_peak_bytes >= 0 THEN mem_peak_bytes END),
               arg_max(rank, mem_peak_bytes)
        FROM events
    """).fetchone()
    lines.append("")
    lines.append(f"peak memory per rank: max {_mib(mem[0])} (rank {mem[2]}), min {_mib(mem[1])} "
                 "(CPU: resident set size, see prism/runtime/memory.py)")
    lines.append("")
    raw = meta_path.parent if meta_path else job_files.raw_dir(job_dir)
    lines.append(f"artifacts: {raw} (PrismTrace), {graph}/*.parquet")
    lines.append(f"query: prism sql --job {shlex.quote(str(job_dir))} \"SELECT * FROM ranks LIMIT 5\"")
    return "\n".join(lines) + "\n"


def _capture_lines(con, meta: dict, job_dir: Path) -> list[str]:
    stats = meta.get("capture", {})
    lines = [f"capture: {meta['world_size']} ranks on {meta.get('devices')} device slots in "
             f"{meta.get('wall_s', 0):.1f} s; {stats.get('context_switches', 0):,} context switches, "
             f"{stats.get('completed_comms', 0):,} communications completed"]
    if stats.get("swaps_out") is not None:  # CUDA with --device-memory-gb: device state moved to host and back
        iters = max(1, con.execute("SELECT max(iterations) FROM ranks").fetchone()[0] or 1)
        lines.append(f"device-state swaps (CUDA checkpoint): {stats['swaps_out']} out, {stats['swaps_in']} in "
                     f"({(stats['swaps_out'] + stats['swaps_in']) / iters:.1f} per iteration), "
                     f"{(stats['swap_out_bytes'] + stats['swap_in_bytes']) / iters / 2**20:.1f} MiB and "
                     f"{(stats['swap_out_s'] + stats['swap_in_s']) / iters:.2f} s per iteration")
    payloads = job_files.payloads_dir(job_files.capture_dir(job_dir))
    if payloads.is_dir():
        files = [p.stat().st_size for p in payloads.rglob("*.bin")]
        lines.append(f"payloads: {len(files):,} distinct contents, {sum(files) / 2**20:.1f} MiB in {payloads}")
    per_iter = con.execute("""
        SELECT rank, iteration, sum(cpu_ns) AS cpu FROM events
        WHERE kind = 'compute' AND iteration >= 1
          AND iteration < (SELECT max(iterations) FROM ranks)  -- not the tail after the last step
        GROUP BY rank, iteration
    """).fetchall()
    lines.append("")
    if per_iter:
        cpu = sorted(c for _, _, c in per_iter)
        lines.append(f"compute per rank and iteration (CPU time, iterations >= 1): median {_ms(statistics.median(cpu))}, "
                     f"min {_ms(cpu[0])}, max {_ms(cpu[-1])}")
    iters = job_files.calibrated(job_dir, "iterations")
    if iters.is_file():
        con.read_parquet(str(iters)).create_view("predicted")
        ends = con.execute("SELECT iteration, end_ns FROM predicted").fetchnumpy()
        times = iteration_times(ends["iteration"], ends["end_ns"])
        if times is not None:
            lines.append(f"PREDICTED iteration time (calibrated from the slice runs, iterations 1..{len(times)}): "
                         f"median {_ms(times.median_ns)}, min {_ms(times.min_ns)}, max {_ms(times.max_ns)}")
        per_rank = con.execute("""
            SELECT rank, median(duration_ns) FROM predicted WHERE iteration >= 1
            GROUP BY rank ORDER BY rank""").fetchall()
        if per_rank:
            lines.append("predicted per-rank iteration time (median): " + ", ".join(
                f"r{r} {m / 1e6:.1f}" for r, m in per_rank[:32]) + (" ..." if len(per_rank) > 32 else "") + " ms")
    else:
        lines.append("iteration time: not predicted yet (the slices and calibrate stages predict it)")
    top = con.execute("""
        SELECT c.op, coalesce(g.group_desc, c.group_name) AS grp, count(DISTINCT c.group_name) AS groups,
               count(*) AS n, sum(c.bytes) AS bytes
        FROM comms c LEFT JOIN groups g ON c.group_name = g.group_name GROUP BY ALL ORDER BY bytes DESC LIMIT 5
    """).fetchall()
    lines.append("")
    lines.append("largest communication (op on groups: groups, count, bytes):")
    for op, grp, groups, n, nbytes in top:
        lines.append(f"  {op:<24} {grp:<12} {groups:>3} groups x{n:<6} {nbytes / 2**20:9.2f} MiB")
    return lines


def _timing_lines(con) -> list[str]:
    lines = []
    con.execute(f"CREATE VIEW iters AS {ITERATIONS_SQL}")
    ends = con.execute("SELECT iteration, t_end AS end_ns FROM iters").fetchnumpy()
    times = iteration_times(ends["iteration"], ends["end_ns"])
    lines.append("")
    if times is not None:
        lines.append(f"iteration time (job, iterations 1..{len(times)}): median "
                     f"{_ms(times.median_ns)}, min {_ms(times.min_ns)}, max {_ms(times.max_ns)}")
    else:
        lines.append("iteration time: fewer than two iterations recorded (run more steps)")
    per_rank = con.execute("""
        SELECT rank, median(dur_ns) AS med FROM iters WHERE dur_ns IS NOT NULL GROUP BY rank ORDER BY rank
    """).fetchall()
    if per_rank:
        meds = [m for _, m in per_rank]
        lines.append(f"per-rank median iteration time: min {_ms(min(meds))} (rank "
                     f"{per_rank[meds.index(min(meds))][0]}), max {_ms(max(meds))} (rank "
                     f"{per_rank[meds.index(max(meds))][0]})")

    split = con.execute("""
        SELECT kind, sum(t_end_ns - t_start_ns) AS wall, sum(cpu_ns) AS cpu
        FROM events WHERE iteration >= 1 GROUP BY kind ORDER BY wall DESC
    """).fetchall()
    total = sum(w for _, w, _ in split) or 1
    lines.append("time by kind (all ranks, iterations >= 1): " + ", ".join(
        f"{k} {100 * w / total:.1f}%" for k, w, _ in split))
    top = con.execute("""
        SELECT c.op, g.group_desc, c.group_name, count(*) AS n, sum(c.bytes) AS bytes,
               sum(c.t_last_end_ns - c.t_first_start_ns) AS span
        FROM comms c LEFT JOIN groups g ON c.group_name = g.group_name
        GROUP BY ALL ORDER BY span DESC LIMIT 5
    """).fetchall()
    lines.append("")
    lines.append("costliest communication (op on group: count, bytes, first start to last end summed):")
    for op, desc, group, n, nbytes, span in top:
        lines.append(f"  {op:<24} {(desc or group):<12} x{n:<6} {nbytes / 2**20:9.2f} MiB  {_ms(span)}")
    return lines


@folder_lock.locks_job("prism summary")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism summary", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder holding graph/")
    parser.add_argument("--show", action="store_true", help="print the existing summary")
    args = parser.parse_args(argv)
    out = job_files.summary(args.job)
    if args.show:
        if not out.is_file():
            print(f"prism summary: no summary at {out}: run `make demo` (or the pipeline) first",
                  file=sys.stderr)
            return 2
        print(out.read_text(), end="")
        return 0
    try:
        text = summarize(args.job)
    except (FileNotFoundError, duckdb.Error, artifacts.ArtifactError) as exc:
        print(f"prism summary: error: {exc}", file=sys.stderr)
        return 2
    tmp = out.with_suffix(".txt.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
