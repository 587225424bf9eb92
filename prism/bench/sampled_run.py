"""Running a prism command as the benchmarks measure it: wall time and the peak memory of its process tree
(the summed PSS of every process under it, sampled), stopped on a timeout (`run_sampled`); `emulate_once`
times one ``prism emulate`` of a job that way (`prism bench emulate`, `prism bench capture --pipeline`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism import job as job_files


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory(threading.Thread):
    """Samples the summed PSS of a process tree; `peak` is the largest sample."""

    def __init__(self, root: int, period: float) -> None:
        super().__init__(daemon=True)
        self.root, self.period, self.peak, self.samples = root, period, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, sum(pss(p) for p in descendants(self.root)))
            self.samples += 1
            self.stop.wait(self.period)


def run_sampled(cmd: list[str], timeout: float | None = None, period: float = 0.5, **popen):
    """Run `cmd` (stdout discarded, stderr kept) while sampling its process tree's PSS; on `timeout` it is
    stopped with SIGTERM (prism's launcher then stops its ranks and writes nothing half). Returns
    (returncode, stderr, wall seconds, peak PSS bytes, timed out)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    sampler = TreeMemory(proc.pid, period=period)
    sampler.start()
    timed_out = False
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.terminate()
        _, err = proc.communicate()
    finally:
        sampler.stop.set()
        sampler.join()
    return proc.returncode, err, time.monotonic() - start, sampler.peak, timed_out


def emulate_once(job: Path, sandbox: str | None, devices: int, extra: list[str] = (),
                 timeout: float | None = None) -> dict:
    """Time one ``prism emulate`` of `job`; returns the row of the table. Stopped (SIGTERM: prism stops its
    ranks and writes no partial `emulation/`) and reported as failed after `timeout` seconds."""
    cmd = [sys.executable, "-m", "prism.cli", "emulate", "--job", str(job), "--devices", str(devices), "--force",
           *extra] + ([] if sandbox is None else ["--sandbox", sandbox])
    code, err, wall, peak, timed_out = run_sampled(cmd, timeout)
    if timed_out:
        err = f"stopped after {timeout:.0f} s (the time left)\n" + err
    if code != 0:
        raise RuntimeError(f"emulate of {job} failed ({code}):\n{err[-3000:]}")
    meta = json.loads(job_files.emulation(job, "meta.json").read_text())
    stats = meta.get("emulation", {})
    it = pq.read_table(job_files.emulation(job, "iterations.parquet"))
    sandbox_rows = it.filter(pc.equal(it["source"].cast("string"), "sandbox"))
    per_iter = [d for k, d in zip(sandbox_rows["iteration"].to_pylist(), sandbox_rows["duration_ns"].to_pylist())
                if k >= 1] or sandbox_rows["duration_ns"].to_pylist()
    cal = pq.read_table(job_files.calibrated(job, "iterations"))
    ranks = [int(r) for r in meta.get("sandbox", [])]
    cal = cal.filter(pc.is_in(cal["rank"], pa.array(ranks, pa.int32())))
    predicted = [d for k, d in zip(cal["iteration"].to_pylist(), cal["duration_ns"].to_pylist()) if k >= 1]
    cone = stats.get("cone") or {}
    return {
        "W": meta.get("world_size"), "sandbox": ",".join(map(str, meta.get("sandbox", []))), "wall_s": wall,
        "startup_s": stats.get("startup_s"), "pss_peak": peak, "communicators": stats.get("communicators"),
        "iteration_s": statistics.median(per_iter) / 1e9 if per_iter else None,
        "iteration_samples": len(per_iter),
        "calibrated_iteration_s": statistics.median(predicted) / 1e9 if predicted else None,
        "cone_live_events": cone.get("cone_live_events"), "virtual_events": cone.get("virtual_events"),
        "gate_late_max_ms": cone.get("gate_late_max_ms"), "real_comms_gated": cone.get("real_comms_gated"),
        "replay_setup_s": cone.get("replay_setup_s"), "replay_kernel_s": cone.get("replay_kernel_s"),
        "prefetch": stats.get("prefetch"),
    }
