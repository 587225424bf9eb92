"""Trace exports of any timeline of a job: Chrome/Perfetto JSON and per-rank Kineto-style JSON (for HTA).

    prism export --job DIR --timeline capture|calibrated|baseline|emulation --format perfetto|kineto [--out P]

- ``perfetto``: one Chrome trace-event JSON file (ui.perfetto.dev, chrome://tracing): one process per rank,
  one thread (track) per stream, one complete ("X") event per event, and flow arrows (``ph: s/f``) for each
  communication: from the send to the receiver's wait (or the recv), and from a collective's last arrival to
  every other member's wait (or the member). Default: ``DIR/export/<timeline>.perfetto.json``.
- ``kineto``: one file per rank, ``DIR/export/<timeline>.kineto/rank-R.json``, in the PyTorch profiler's
  (Kineto's) layout that Holistic Trace Analysis reads: ``distributedInfo`` (rank, world_size),
  ``deviceProperties``, and ``traceEvents``: a ``ProfilerStep#k`` annotation per iteration (HTA's iterations),
  every event a ``cpu_op`` on the rank's host thread
  and, for compute and communication, a ``kernel`` on a device stream (compute on the program's stream,
  communication on its own stream named ``ncclDevKernel_<op>``, spanning from the op's issue to the end of
  the wait on it), linked by ``correlation``/``External id`` through a ``cuda_runtime`` launch. prism's
  ranks run on CPU or GPU alike: these "kernels" are prism's events on the rank's device clock.

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

from prism.artifacts import ArtifactError, check_out, first_unreadable
from prism.report.data import TIMELINES, Timeline, load_timeline

FORMATS = ("perfetto", "kineto")
COMPUTE_STREAM = 7  # Kineto's default CUDA stream id
COMM_STREAM = 20  # communication kernels: their own stream, as NCCL's


def _us(ns) -> float:
    return round(float(ns) / 1e3, 3)


def _flows(tl: Timeline) -> list[tuple[int, int]]:
    """(source row, destination row) of `tl.events` per communication arrow (see the module docstring)."""
    ev = tl.events.with_row_index("row")
    ops = ev.filter(pl.col("comm_id") >= 0).select("row", "event_id", "comm_id", "kind", "start_ns")
    waits = ev.filter(pl.col("op_event_id") >= 0).select(pl.col("op_event_id").alias("event_id"),
                                                          pl.col("row").alias("wait_row"))
    ops = ops.join(waits, on="event_id", how="left").with_columns(
        dst=pl.coalesce("wait_row", "row"))
    # source: the send of a p2p pair, else the member issued last (ties: the larger row)
    ops = ops.with_columns(prio=(pl.col("kind") == "send").cast(pl.Int64))
    src = (ops.sort("comm_id", "prio", "start_ns", "row")
           .group_by("comm_id", maintain_order=True).agg(src=pl.col("row").last()))
    pairs = ops.join(src, on="comm_id").filter((pl.col("row") != pl.col("src")) & (pl.col("kind") != "send"))
    pairs = pairs.sort("comm_id", "row")
    return list(zip(pairs["src"].to_list(), pairs["dst"].to_list()))


def perfetto(tl: Timeline) -> dict:
    """The Chrome trace-event JSON of a timeline (a dict for json.dump)."""
    ev = tl.events
    out: list[dict] = []
    for rank in sorted(ev["rank"].unique().to_list()):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream in ev.select("rank", "stream").unique().sort("rank", "stream").iter_rows():
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": stream,
                    "args": {"name": "program" if stream == 0 else f"stream {stream}"}})
    rows = ev.select("rank", "stream", "kind", "op", "group", "iteration", "seq", "event_id", "bytes",
                     "start_ns", "end_ns").rows()
    for rank, stream, kind, op, group, iteration, seq, event_id, nbytes, start, end in rows:
        args = {"event_id": event_id, "seq": seq, "iteration": iteration}
        if group is not None:
            args["group"] = group
        if nbytes:
            args["bytes"] = nbytes
        out.append({"ph": "X", "name": op, "cat": kind, "pid": rank, "tid": stream, "ts": _us(start),
                    "dur": _us(end - start), "args": args})
    for flow_id, (s, d) in enumerate(_flows(tl), start=1):
        src, dst = rows[s], rows[d]
        mid_s = (src[9] + src[10]) // 2
        mid_d = (dst[9] + dst[10]) // 2
        common = {"name": src[3], "cat": "comm", "id": flow_id}
        out.append({**common, "ph": "s", "pid": src[0], "tid": src[1], "ts": _us(mid_s)})
        out.append({**common, "ph": "f", "bp": "e", "pid": dst[0], "tid": dst[1], "ts": _us(mid_d)})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"prism_timeline": tl.name, "world_size": tl.world}}


def _comm_spans(ev: pl.DataFrame) -> pl.DataFrame:
    """Per communication op (collective, send, recv): its row and the end of the wait on it (else its own)."""
    waits = ev.filter(pl.col("op_event_id") >= 0).group_by("op_event_id").agg(wait_end=pl.col("end_ns").max())
    ops = ev.with_row_index("row").filter(pl.col("kind").is_in(["collective", "send", "recv"]))
    return ops.join(waits, left_on="event_id", right_on="op_event_id", how="left").with_columns(
        kernel_end=pl.max_horizontal("end_ns", pl.col("wait_end").fill_null(0)))


def kineto(tl: Timeline, rank: int) -> dict:
    """The Kineto-style trace of one rank (a dict for json.dump)."""
    ev = tl.events.filter(pl.col("rank") == rank)
    spans = {row: end for row, end in _comm_spans(ev).select("row", "kernel_end").iter_rows()}
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} (host)"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "device 0"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 1, "args": {"name": "program"}},
    ]
    steps = ev.group_by("iteration").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort("iteration")
    for iteration, start, end in steps.rows():  # HTA splits a trace into iterations by these
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{iteration}", "pid": rank,
                    "tid": 1, "ts": _us(start), "dur": _us(end - start), "args": {"External id": 0}})
    rows = ev.select("kind", "op", "group", "iteration", "event_id", "bytes", "start_ns", "end_ns", "stream").rows()
    correlation = 0
    for i, (kind, op, group, iteration, event_id, nbytes, start, end, stream) in enumerate(rows):
        correlation += 1
        args = {"External id": correlation, "event_id": event_id, "iteration": iteration}
        out.append({"ph": "X", "cat": "cpu_op" if kind != "marker" else "user_annotation", "name": op,
                    "pid": rank, "tid": 1, "ts": _us(start), "dur": _us(end - start), "args": args})
        if kind not in ("compute", "collective", "send", "recv"):
            continue
        comm = kind != "compute"
        name = f"ncclDevKernel_{op}" if comm else f"prism_compute_{op}"
        device_stream = (COMM_STREAM if comm else COMPUTE_STREAM) + stream
        kernel_end = spans.get(i, end) if comm else end
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": rank, "tid": 1,
                    "ts": _us(start), "dur": 0.0, "args": {"correlation": correlation, "External id": correlation}})
        kargs = {"device": 0, "stream": device_stream, "correlation": correlation, "External id": correlation,
                 "event_id": event_id}
        if comm:
            kargs.update({"Collective name": op, "In msg nelems": int(nbytes), "dtype": "Byte",
                          "Process Group Name": group or ""})
        out.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": device_stream, "ts": _us(start),
                    "dur": _us(kernel_end - start), "args": kargs})
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
        path = check_out(Path(out) if out else job / "export" / f"{timeline}.perfetto.json")
        payload = perfetto(load_timeline(job, timeline))
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, payload)
        return path
    folder = check_out(Path(out) if out else job / "export" / f"{timeline}.kineto", folder=True)
    tl = load_timeline(job, timeline)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for rank in np.unique(tl.events["rank"].to_numpy()).tolist():
            # '"rank": R' with a space: HTA finds a file's rank with the regex '"rank":\s+(\d+)'
            _write_json(staging / f"rank-{rank}.json", kineto(tl, rank), separators=(", ", ": "))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


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
    except ArtifactError as exc:
        print(f"prism export: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"prism export: error: cannot write {exc.filename or args.out} ({exc.strerror}); choose a path in "
              "a writable folder", file=sys.stderr)
        return 2
    except Exception as exc:  # a reader deep in the export (polars, pyarrow): name the file that is damaged
        found = first_unreadable(args.job)
        if found is None:
            raise
        print(f"prism export: error: {found}", file=sys.stderr)
        return 2
    print(f"prism export: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
