"""Trace exports of any timeline of a job: Chrome/Perfetto JSON and per-rank Kineto-style JSON (for HTA).

    prism export --job DIR --timeline capture|calibrated|baseline|emulation --format perfetto|kineto [--out P]

- ``perfetto``: one Chrome trace-event JSON file (ui.perfetto.dev, chrome://tracing): one process per rank,
  one thread (track) per stream, one complete ("X") event per event, sorted by start on each track (a track's
  events never overlap: `prism.schemas.check_timeline` holds every timeline to that), args naming the group
  and its ranks (``tp[0,1]``), and flow arrows (``ph: s/f``) for each communication, forward in time: from
  the send's issue to the receiver's completion (the end of its wait, or the recv), and from a collective's
  last arrival (the issue of the member that came last) to every other member's completion. An arrow that
  would point backwards is left out and counted (``otherData.flows_left_out``): a measured timeline (capture,
  baseline: separate processes) can have one; the calibrated and emulation timelines are held to none
  (`tests/workflow/test_workflow.py`, the tiny job).
  Default: ``DIR/export/<timeline>.perfetto.json``.
- ``kineto``: one file per rank, ``DIR/export/<timeline>.kineto/rank-R.json``, in the PyTorch profiler's
  (Kineto's) layout that Holistic Trace Analysis reads: ``distributedInfo`` (rank, world_size),
  ``deviceProperties``, and ``traceEvents``: a ``ProfilerStep#k`` annotation per iteration (HTA's iterations),
  every event a ``cpu_op`` on the rank's host thread (pid ``1000 + rank``) and, for compute and
  communication, a ``kernel`` on the device (pid 0, as Kineto numbers a process's device) on one stream per
  kind, each stream a named track that runs one kernel at a time: compute on the program's stream (7),
  communication on its own (20, kernels ``ncclDevKernel_<op>``, as NCCL's), a communication kernel from the
  op's issue (or the end of the stream's previous kernel, when later) to the end of the wait on it; kernels
  are linked to their host op by ``correlation``/``External id`` through a ``cuda_runtime`` launch at the
  op's start. The device's timeline is the host's 1 us later (a launch latency: HTA orders launches and
  kernels by their time alone, in whole us, so a kernel at its launch's time could be counted before it,
  a queue of -1); kernels keep their events' durations. prism's
  ranks run on CPU or GPU alike: these "kernels" are prism's events on the rank's device clock.

Idle and waiting, prism's and HTA's (they answer different questions, so their numbers differ):

- the report's *idle* (`prism.report.data.time_breakdown`) is the part of a rank's waits beyond their own
  duration: the time the rank was blocked on other ranks (a slow peer, a late collective member);
- HTA's *idle* (temporal breakdown) is the time no kernel runs on the device. A communication kernel here
  spans the rank's wait on it, as an NCCL kernel spins on the device while its peers arrive, so the time
  prism calls idle HTA counts as communication ("non-compute"), and HTA's idle is only the host-side gaps
  (markers, op issue between kernels); HTA's ``kernel_wait`` is the gap between consecutive kernels, and its
  queue length the launches not yet run, both >= 0 because each stream runs one kernel at a time.

Timestamps are microseconds (floats, ns resolution) from the timeline's first event. Files are written to a
temp name and renamed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import polars as pl

from prism import folder_lock
from prism import job as job_files
from prism.artifacts import ArtifactError, check_out, stage_error
from prism.report.data import TIMELINES, Timeline, load_timeline

FORMATS = ("perfetto", "kineto")
COMPUTE_STREAM = 7  # Kineto's default CUDA stream id
COMM_STREAM = 20  # communication kernels: their own stream, as NCCL's


def _us(ns) -> float:
    return round(float(ns) / 1e3, 3)


def group_names(job: str | Path, timeline: str) -> dict[str, str]:
    """{group id: its name and ranks, e.g. "tp[0,1]"} from the graph's ``groups.parquet`` of the timeline
    (``baseline/graph/`` for the baseline, ``graph/`` otherwise); {} when it is not there."""
    path = job_files.graph_file(job_files.baseline(job) if timeline == "baseline" else job, "groups")
    if not path.is_file():
        return {}
    groups = pl.read_parquet(path, columns=["group_name", "group_desc", "members"])
    return {g: f"{d or 'group ' + g}[{','.join(map(str, sorted(m)))}]"
            for g, d, m in groups.iter_rows()}


def _flows(tl: Timeline) -> list[tuple[int, int, int, int]]:
    """(source row, its time, destination row, its time) of `tl.events` per communication arrow: from the issue
    of a send (a p2p pair), or of the member that arrived last (a collective), to every other member's
    completion: the end of its wait on the op (else the op's own end)."""
    ev = tl.events.with_row_index("row")
    ops = ev.filter(pl.col("comm_id") >= 0).select("row", "event_id", "comm_id", "kind", "start_ns", "end_ns")
    waits = (ev.filter(pl.col("op_event_id") >= 0).sort("end_ns")
             .group_by("op_event_id").agg(wait_row=pl.col("row").last(), wait_end=pl.col("end_ns").last())
             .rename({"op_event_id": "event_id"}))
    ops = ops.join(waits, on="event_id", how="left").with_columns(
        dst=pl.coalesce("wait_row", "row"), dst_ns=pl.coalesce("wait_end", "end_ns"))
    ops = ops.with_columns(prio=(pl.col("kind") == "send").cast(pl.Int64))
    src = (ops.sort("comm_id", "prio", "start_ns", "row")
           .group_by("comm_id", maintain_order=True).agg(src=pl.col("row").last(), src_ns=pl.col("start_ns").last()))
    pairs = ops.join(src, on="comm_id").filter((pl.col("row") != pl.col("src")) & (pl.col("kind") != "send"))
    pairs = pairs.sort("comm_id", "row")
    return list(zip(*(pairs[c].to_list() for c in ("src", "src_ns", "dst", "dst_ns"))))


def perfetto(tl: Timeline, groups: dict[str, str] | None = None) -> dict:
    """The Chrome trace-event JSON of a timeline (a dict for json.dump). `groups`: {group id: name}
    (`group_names`), shown in the events' args. Flows run forward in time, from the sender's issue (or the
    collective's last arrival) to the receiver's completion; an arrow that would point backwards (a measured
    timeline whose ranks' clocks disagree) is left out and counted in ``otherData.flows_left_out``. The
    calibrated and the emulation timelines leave none out: the first is one sweep, and the emulation's computed
    rows after its live ones are swept from them (`prism.emulate.tail`)."""
    groups = groups or {}
    ev = tl.events.sort("rank", "stream", "start_ns", "seq")
    out: list[dict] = []
    for rank in sorted(ev["rank"].unique().to_list()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream in ev.select("rank", "stream").unique().sort("rank", "stream").iter_rows():
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": stream,
                    "args": {"name": "program" if stream == 0 else f"stream {stream}"}})
    has_source = "source" in ev.columns
    cols = ["rank", "stream", "kind", "op", "group_name", "iteration", "seq", "event_id", "bytes", "start_ns", "end_ns"]
    for rank, stream, kind, op, group, iteration, seq, event_id, nbytes, start, end, *source in ev.select(
            cols + (["source"] if has_source else [])).iter_rows():
        args = {"event_id": event_id, "seq": seq, "iteration": iteration}
        if group is not None:
            args["group"] = groups.get(group, group)
        if nbytes:
            args["bytes"] = nbytes
        if source:
            args["source"] = source[0]
        out.append({"ph": "X", "name": op, "cat": kind, "pid": rank, "tid": stream, "ts": _us(start),
                    "dur": _us(end - start), "args": args})
    rows = tl.events.select("rank", "stream", "op", "start_ns", "end_ns").rows()
    flow_id, left_out = 0, 0
    for s, s_ns, d, d_ns in _flows(tl):
        if d_ns < s_ns:
            left_out += 1
            continue
        flow_id += 1
        src, dst = rows[s], rows[d]
        common = {"name": src[2], "cat": "comm", "id": flow_id}
        # the arrow's head inside the destination slice (binding "e": the enclosing slice), at its completion
        head = max(dst[3], s_ns, d_ns - 1) if d_ns > dst[3] else d_ns
        out.append({**common, "ph": "s", "pid": src[0], "tid": src[1], "ts": _us(s_ns)})
        out.append({**common, "ph": "f", "bp": "e", "pid": dst[0], "tid": dst[1], "ts": _us(head)})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"prism_timeline": tl.name, "world_size": tl.world, "flows_left_out": left_out}}


def _comm_spans(ev: pl.DataFrame) -> pl.DataFrame:
    """Per communication op (collective, send, recv): its row and the end of the wait on it (else its own)."""
    waits = ev.filter(pl.col("op_event_id") >= 0).group_by("op_event_id").agg(wait_end=pl.col("end_ns").max())
    ops = ev.with_row_index("row").filter(pl.col("kind").is_in(["collective", "send", "recv"]))
    return ops.join(waits, left_on="event_id", right_on="op_event_id", how="left").with_columns(
        kernel_end=pl.max_horizontal("end_ns", pl.col("wait_end").fill_null(0)))


LAUNCH_US = 1.0  # the device timeline runs this far behind the host's: a kernel starts after its launch
HOST_PID = 1000  # a rank's host process is pid HOST_PID + rank; its device is pid 0 (Kineto's device id)
DEVICE_PID = 0


def kineto(tl: Timeline, rank: int, groups: dict[str, str] | None = None) -> dict:
    """The Kineto-style trace of one rank (a dict for json.dump); see the module docstring."""
    groups = groups or {}
    ev = tl.events.filter(pl.col("rank") == rank).sort("seq")
    spans = {row: end for row, end in _comm_spans(ev).select("row", "kernel_end").iter_rows()}
    host = HOST_PID + rank
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": f"rank {rank} (host)"}},
        {"ph": "M", "name": "process_name", "pid": DEVICE_PID, "tid": 0, "args": {"name": f"rank {rank} device"}},
        {"ph": "M", "name": "thread_name", "pid": host, "tid": 1, "args": {"name": "program"}},
    ]
    steps = ev.group_by("iteration").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort("iteration")
    for iteration, start, end in steps.rows():  # HTA splits a trace into iterations by these
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{iteration}", "pid": host,
                    "tid": 1, "ts": _us(start), "dur": _us(end - start), "args": {"External id": 0}})
    rows = ev.select("kind", "op", "group_name", "iteration", "event_id", "bytes", "start_ns", "end_ns",
                     "stream").rows()
    correlation = 0
    stream_free: dict[int, int] = {}  # each device stream runs one kernel at a time: when it is free again
    for i, (kind, op, group, iteration, event_id, nbytes, start, end, stream) in enumerate(rows):
        correlation += 1
        args = {"External id": correlation, "event_id": event_id, "iteration": iteration}
        out.append({"ph": "X", "cat": "cpu_op" if kind != "marker" else "user_annotation", "name": op,
                    "pid": host, "tid": 1, "ts": _us(start), "dur": _us(end - start), "args": args})
        if kind not in ("compute", "collective", "send", "recv"):
            continue
        comm = kind != "compute"
        name = f"ncclDevKernel_{op}" if comm else f"prism_compute_{op}"
        device_stream = (COMM_STREAM if comm else COMPUTE_STREAM) + stream
        k_start = max(start, stream_free.get(device_stream, start))
        k_end = max(k_start, spans.get(i, end) if comm else end)
        stream_free[device_stream] = k_end
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host, "tid": 1,
                    "ts": _us(start), "dur": 0.0, "args": {"correlation": correlation, "External id": correlation}})
        kargs = {"device": 0, "stream": device_stream, "correlation": correlation, "External id": correlation,
                 "event_id": event_id}
        if comm:
            kargs.update({"Collective name": op, "In msg nelems": int(nbytes), "dtype": "Byte",
                          "Process Group Name": groups.get(group, group or "")})
        out.append({"ph": "X", "cat": "kernel", "name": name, "pid": DEVICE_PID, "tid": device_stream,
                    "ts": _us(k_start) + LAUNCH_US, "dur": _us(k_end - k_start), "args": kargs})
    for device_stream in sorted(stream_free):
        what = "communication" if device_stream >= COMM_STREAM else "compute"
        out.append({"ph": "M", "name": "thread_name", "pid": DEVICE_PID, "tid": device_stream,
                    "args": {"name": f"stream {device_stream} ({what})"}})
    # each track in time order, an enclosing slice before what it encloses
    out.sort(key=lambda e: (e["ph"] != "M", e["pid"], e["tid"], e.get("ts", 0), -e.get("dur", 0)))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": tl.world},
        "deviceProperties": [{"id": 0, "name": "prism device", "totalGlobalMem": 0, "computeMajor": 0,
                              "computeMinor": 0, "maxThreadsPerBlock": 0, "maxThreadsPerMultiprocessor": 0,
                              "regsPerBlock": 0, "regsPerMultiprocessor": 0, "warpSize": 32,
                              "sharedMemPerBlock": 0, "sharedMemPerMultiprocessor": 0, "numSms": 1,
                              "sharedMemPerBlockOptin": 0}],
        "traceEvents": out,
        "traceName": f"prism {tl.name} rank {rank}",
        "displayTimeUnit": "ms",
    }


def _write_json(path: Path, payload: dict, separators: tuple[str, str] = (",", ":")) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            json.dump(payload, fh, separators=separators)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def export(job: str | Path, timeline: str, fmt: str, out: str | Path | None = None) -> Path:
    """Write the export; returns the file (perfetto) or folder (kineto) written."""
    job = Path(job)
    if fmt not in FORMATS:
        raise ArtifactError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "perfetto":
        name = f"{timeline}.perfetto.json"
        path = check_out(Path(out) if out else job / "export" / name, example=name)
        payload = perfetto(load_timeline(job, timeline), group_names(job, timeline))
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, payload)
        return path
    folder = check_out(Path(out) if out else job / "export" / f"{timeline}.kineto", folder=True)
    tl = load_timeline(job, timeline)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    groups = group_names(job, timeline)
    try:
        for rank in np.unique(tl.events["rank"].to_numpy()).tolist():
            # '"rank": R' with a space: HTA finds a file's rank with the regex '"rank":\s+(\d+)'
            _write_json(staging / f"rank-{rank}.json", kineto(tl, rank, groups), separators=(", ", ": "))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


@folder_lock.locks_job("prism export")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>)")
    parser.add_argument("--timeline", choices=TIMELINES, required=True, help="which timeline to export")
    parser.add_argument("--format", choices=FORMATS, required=True, dest="fmt", help="trace format")
    parser.add_argument("--out", type=Path, help="file (perfetto) or folder (kineto) to write")
    args = parser.parse_args(argv)
    try:
        path = export(args.job, args.timeline, args.fmt, args.out)
    except Exception as exc:
        return stage_error("prism export", args.job, args.out, exc)
    print(f"prism export: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
