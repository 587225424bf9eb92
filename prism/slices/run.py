"""Slice run: the ranks of one planned slice run the real program together, every other rank replayed.

    prism slices run --job DIR --slice K [--config-json JSON] [--capture CAPDIR]
        ->  DIR/slices/slice=K/{events,replay_ops}.parquet
    prism slices run --job DIR --all      every measured slice of the plan, one after another
    prism slices run --job DIR --slice K --timed-by DIR/calibrated_untimed/timeline.parquet
        ->  DIR/slices_timed/slice=K/{events,replay}.parquet

Reads the plan (`DIR/slices/plan.parquet`), runs the slice's ranks with `prism launch --mode slice`
(pinned, one core each, on the real transport among them; a replay server answers for the other ranks
from the capture's payloads, so data-dependent behaviour is exact), writes what that server played op by op
(`replay_ops.parquet`, `prism.slices.replay_ops`: whether it issued after the slice's members), and the slice ranks' events:
the graph's EVENTS columns, rows aligned with the capture graph's events of those ranks (same
`event_id`, `comm_id`, `op_event_id`), times measured in the slice run (`cpu_ns`: the rank's own thread
CPU time, never across a context switch; `device_ns`: the same on CPU, and on CUDA the GPU time between the
event's boundaries, from CUDA events on the rank's stream).

CUDA (`PRISM_DEVICE=cuda`, the capture's device unless the config says otherwise): the slice ranks run the
program with CUDA tensors (on one GPU they share it, each rank its own process and stream, as capture's
slots do), the replay server stays on the host (CPU tensors, no CUDA), and data crosses at the boundary
through gloo, which copies CUDA tensors to and from host memory. Every slice event must carry its clocks:
no negative duration, and on CUDA every compute event its GPU time (`check_clocks`); otherwise the run is
reported and nothing is written.

Timed (`--timed-by TIMELINE`, the second pass of the calibration): the replayed ranks answer at their
times in that calibrated timeline (`prism.runtime.slice.replay_server`, on the clock emulation uses), so the slice
ranks wait for their virtual peers as they would in the real job; the output goes to `DIR/slices_timed/`,
with `replay.parquet` (when the replayed members issued each op with a slice rank).

The capture is `DIR/capture` (the pipeline's layout) or `DIR` itself when it holds `raw/` (a job folder
made by `prism launch --mode capture --out DIR`); `--capture` names it explicitly. The graph is
`DIR/graph`. The program is the job config's workload (`--config-json`), else the capture's own command.
Each slice rank must issue exactly the events it issued in the capture; otherwise the run is reported
(rank, first differing event) and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from prism import folder_lock
from prism import artifacts, event_sequence, schemas, settings
from prism import job as job_files
from prism import config as prism_config
from prism.runtime.launch import launcher
from prism.slices import replay_ops

class SliceError(Exception):
    """Bad input (exit 2): the message says what is missing and how to fix it."""


class MismatchError(Exception):
    """The slice run did not issue the capture's events, or recorded broken clocks (exit 1)."""


def _capture_dir(job: Path, explicit: Path | None) -> tuple[Path, dict]:
    """The capture replayed (`--capture`, else the job's) and its checked meta.json (`prism.job`)."""
    return job_files.find_capture(job, candidates=[explicit] if explicit is not None else None)


def _plan(job: Path, k: int) -> list[int]:
    path = job_files.slice_plan(job)
    if not path.is_file():
        raise SliceError(f"{path}: missing; run `prism slices plan --job {job} --devices P` first")
    try:
        plan = artifacts.read_parquet(path)
    except artifacts.ArtifactError as exc:
        raise SliceError(str(exc)) from None
    slices = sorted(set(plan["slice"].to_pylist()))
    if k not in slices:
        raise SliceError(f"slice {k} is not in the plan {path} (its slices: "
                         f"{', '.join(map(str, slices)) or 'none'})")
    ranks = plan.filter(pc.equal(plan["slice"], k))["rank"].to_pylist()
    return sorted(ranks)


def _program(config_json: str | None, meta: dict) -> tuple[int, str | None, str | None, list[str]]:
    """(W, script, module, args) of the program to run."""
    world = int(meta["world_size"])
    if config_json:
        try:
            job = prism_config.from_dict(json.loads(config_json), "--config-json")
        except (prism_config.ConfigError, json.JSONDecodeError) as exc:
            raise SliceError(str(exc)) from None
        os.environ.update(job.environment())  # the slice ranks run where the config says (PRISM_DEVICE)
        if job.nproc != world:
            raise SliceError(f"the config's nproc {job.nproc} differs from the capture's world size {world}: "
                             "re-run the capture with this config")
        return world, job.workload.script, job.workload.module, list(job.workload.args)
    os.environ.setdefault(settings.DEVICE.name, meta.get("device", "cpu"))  # where the capture ran
    cmd = list(meta.get("command") or [])
    if not cmd:
        raise SliceError("the capture's meta.json has no command; pass --config-json")
    if cmd[0] == "-m":
        return world, None, cmd[1], cmd[2:]
    return world, cmd[0], None, cmd[1:]


def align(rank: int, measured: pa.Table, graph: pa.Table) -> pa.Table:
    """The rank's slice events with the graph's ids; raises MismatchError at the first differing event."""
    measured = measured.sort_by("seq")
    graph = graph.sort_by("seq")
    got, want = event_sequence.sequence(measured), event_sequence.sequence(graph)
    i = event_sequence.first_departure(got, want)
    if i is not None:
        raise MismatchError(
            f"rank {rank} did not repeat its capture: event {i} (seq) is {event_sequence.describe(got, i)} "
            f"in the slice run but {event_sequence.describe(want, i)} in the capture graph "
            f"({len(got)} vs {len(want)} events). The slice ran another program or arguments than the capture "
            "(slice outputs from another capture?), or the program is nondeterministic; re-run the capture, "
            "graph and plan with the same program")
    out = measured
    for name in ("event_id", "comm_id", "op_event_id"):
        out = out.append_column(name, graph[name])
    return out


def check_clocks(rank: int, measured: pa.Table, device: str) -> None:
    """Every event of the rank's slice run has its durations: none negative (-1: not measured), the wall
    span not backwards, and on CUDA every compute event's GPU time measured (`device_ns` >= 0), which
    calibration takes as the event's duration. Raises MismatchError naming the rank and the first event."""
    cpu, dev, start, end = (measured[c].to_numpy() for c in ("cpu_ns", "device_ns", "t_start_ns", "t_end_ns"))
    kinds = measured["kind"]
    if pa.types.is_dictionary(kinds.type):
        kinds = kinds.cast(pa.string())
    compute = pc.equal(kinds, schemas.KIND_COMPUTE).to_numpy(zero_copy_only=False)
    cuda = device.startswith("cuda")
    checks = [(cpu < -1, "a negative CPU time"), (dev < -1, "a negative device time"),
              (end < start, "an end before its start")]
    if cuda:
        checks.append((compute & (dev < 0), "no GPU time (device_ns -1: recorded without CUDA events, no GPU here?)"))
    bad = [(int(mask.argmax()), why) for mask, why in checks if mask.any()]
    if bad:
        i, why = min(bad)
        seq, kind, op = measured["seq"][i].as_py(), kinds[i].as_py(), measured["op"][i].as_py()
        cpu, dev, start, end = int(cpu[i]), int(dev[i]), int(start[i]), int(end[i])
        raise MismatchError(
            f"rank {rank}: slice event seq {seq} ({kind} {op}) has {why} (cpu_ns {cpu}, device_ns {dev}, wall "
            f"{end - start} ns) on {device}: the slice run's recorder is broken; re-run the slice (and report it)")


def run(job: Path, k: int, config_json: str | None, capture: Path | None, pin: bool,
        timed_by: Path | None = None) -> int:
    ranks = _plan(job, k)
    cap, meta = _capture_dir(job, capture)
    graph_path = job_files.graph_file(job, "events")
    if not graph_path.is_file():
        raise SliceError(f"{graph_path}: missing; run the graph stage first (prism graph --job ...)")
    sources = [job_files.raw_dir(cap), graph_path, job_files.slice_plan(job)]
    if timed_by is not None:
        if not timed_by.is_file():
            raise SliceError(f"--timed-by {timed_by}: missing; calibrate the untimed slices first (prism "
                             f"calibrate --job {job} --durations {job_files.own_durations(job)} --transfers "
                             f"{job_files.slice_transfers(job)} --out "
                             f"{job_files.calibrated_dir(job, job_files.UNTIMED_CALIBRATION)})")
        if timed_by.resolve().parent.parent != job.resolve():
            raise SliceError(f"--timed-by {timed_by} is not a timeline of the job {job} (JOB/<folder>/timeline.parquet)")
        sources.append(timed_by)
    run_id = artifacts.same_run(sources)
    world, script, module, args = _program(config_json, meta)
    pass_dir = job_files.TIMED_SLICES if timed_by is not None else job_files.SLICES
    folder = job_files.slices_dir(job, pass_dir)
    staging = folder / f".slice={k}.run"
    shutil.rmtree(staging, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    spec = launcher.LaunchSpec(nproc=world, script=script, module=module, args=args, mode="slice",
                               out=staging, pin=pin, slice_ranks=ranks, capture=cap, timed_by=timed_by)
    try:
        try:
            code = launcher.launch(spec)
        except launcher.LaunchError as exc:
            raise SliceError(str(exc)) from None
        if code != 0:
            print(f"prism slices run: slice {k} (ranks {ranks}) failed (exit code {code}); nothing written",
                  file=sys.stderr)
            return code
        graph = artifacts.read_parquet(graph_path)
        run_meta = json.loads(job_files.meta_path(staging).read_text())
        parts = []
        for r in ranks:
            measured = artifacts.read_raw_stream(job_files.rank_stream(staging, r), schemas.RAW_EVENTS)
            check_clocks(r, measured, run_meta.get("device", "cpu"))
            parts.append(align(r, measured, graph.filter(pc.equal(graph["rank"], r))))
        table = pa.concat_tables(parts)
        tables, table_schemas = {"events": table}, {"events": schemas.SLICE_EVENTS}
        played = job_files.replay_stream(staging, "ops.arrow")  # what the replay server played, op by op
        tables["replay_ops"] = (replay_ops.with_comm_ids(artifacts.read_raw_stream(played), table) if played.is_file()
                                else schemas.SLICE_REPLAY_OPS.empty_table())
        table_schemas["replay_ops"] = schemas.SLICE_REPLAY_OPS
        if timed_by is not None:
            issues = job_files.replay_stream(staging, "issues.arrow")
            tables["replay"] = (artifacts.read_raw_stream(issues, schemas.SLICE_REPLAY) if issues.is_file()
                                else schemas.SLICE_REPLAY.empty_table())  # a slice without virtual peers
            table_schemas["replay"] = schemas.SLICE_REPLAY
        artifacts.write_outputs(job_files.slice_dir(job, k, pass_dir), tables, table_schemas,
                                run_id=run_id)  # the capture's run, not the slice launch's own
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    replay = run_meta.get("replay", {})
    print(f"prism slices run: slice {k} ranks {','.join(map(str, ranks))}: {table.num_rows} events in "
          f"{run_meta.get('wall_s', 0):.1f} s; replay server: {replay.get('virtual_members', '?')} virtual members "
          f"in {replay.get('groups', '?')} groups, {replay.get('collectives', '?')} collectives"
          f"{_in_flight(replay.get('in_flight'))}, "
          f"{replay.get('messages', '?')} messages{' (timed)' if replay.get('timed') else ''}, device "
          f"{run_meta.get('device', 'cpu')} -> "
          f"{job_files.slice_file(job, k, folder=pass_dir)}")
    late = replay_ops.lateness(tables["replay_ops"], table)
    if late:
        cpu = replay.get("threads_cpu_s") or {}
        top = ", ".join(f"{name} {s:.2f}" for name, s in sorted(cpu.items(), key=lambda kv: -kv[1])[:4])
        print(f"prism slices run: slice {k}: the replay server's ops against the slice ranks' (replay_ops.parquet); "
              f"its CPU {replay.get('cpu_s', 0):.2f} s on cores {replay.get('cores', '?')} ({top}), its threads "
              f"runnable but waiting for a CPU {sum((replay.get('threads_runq_wait_s') or {}).values()):.2f} s:\n"
              + replay_ops.describe(late))
    return 0


def _in_flight(bounds: dict | None) -> str:
    """The replay server's in-flight bound per group with collectives (from the capture), as printed."""
    shown = {g: n for g, n in (bounds or {}).items() if n > 1}
    return f" (in flight at most: {', '.join(f'group {g} {n}' for g, n in shown.items())})" if shown else ""


def run_all(job: Path, config_json: str | None, capture: Path | None, pin: bool, timed_by: Path | None) -> int:
    """Every measured slice of the plan in turn; stops at the first that fails (its exit code)."""
    plan_path = job_files.slice_plan(job)
    if not plan_path.is_file():
        raise SliceError(f"{plan_path} is missing: plan the slices first (prism slices plan --job {job} --devices P)")
    rows = artifacts.read_parquet(plan_path, columns=["slice", "measured"]).to_pylist()
    ks = sorted({r["slice"] for r in rows if r["measured"]})
    for i, k in enumerate(ks, start=1):
        print(f"prism slices run: slice {k} ({i} of {len(ks)} measured)", file=sys.stderr)
        code = run(job, k, config_json, capture, pin, timed_by)
        if code:
            return code
    return 0


@folder_lock.locks_job("prism slices run")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism slices run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder (capture/, graph/, slices/plan.parquet)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--slice", type=int, help="the slice number K in the plan")
    which.add_argument("--all", action="store_true",
                       help="every measured slice of the plan (slices/plan.parquet), one after another")
    parser.add_argument("--config-json", help="the job config as JSON (what the Snakefile passes)")
    parser.add_argument("--capture", type=Path, help="the capture folder (default: JOB/capture, or JOB)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the slice ranks to cores")
    parser.add_argument("--timed-by", type=Path, metavar="TIMELINE",
                        help=f"replayed ranks answer at their times in this calibrated timeline (JOB/"
                             f"{job_files.UNTIMED_CALIBRATION}/timeline.parquet); writes "
                             f"JOB/{job_files.TIMED_SLICES}/slice=K")
    args = parser.parse_args(argv)
    try:
        if args.all:
            return run_all(args.job, args.config_json, args.capture, not args.no_pin, args.timed_by)
        return run(args.job, args.slice, args.config_json, args.capture, not args.no_pin, args.timed_by)
    except (SliceError, artifacts.ArtifactError) as exc:
        print(f"prism slices run: error: {exc}", file=sys.stderr)
        return 2
    except MismatchError as exc:
        print(f"prism slices run: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
