"""What `prism emulate` needs from the job folder, checked before anything runs.

A job folder holds the capture (``capture/{raw,payloads}`` in the pipeline's layout, or ``raw/`` and
``payloads/`` directly when made by ``prism launch --mode capture --out DIR``), ``graph/`` and
``calibrated/``. The sandbox ranks run the program the capture ran: ``raw/meta.json``'s ``command``
(``-m MODULE ARGS`` or ``SCRIPT ARGS``), never retyped.

Each check that fails raises `EmulateInputError`: what is missing or inconsistent, and the command that
fixes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from prism import artifacts
from prism import job as job_files


class EmulateInputError(ValueError):
    """The job cannot be emulated as it is; the message names the file and the fix (exit 2)."""


@dataclass(frozen=True)
class Job:
    """A job folder ready to emulate."""

    dir: Path
    capture: Path  # the folder holding raw/ and payloads/
    meta: dict  # the capture's raw/meta.json
    world: int
    module: str | None
    script: str | None
    args: list[str]

    @property
    def program(self) -> list[str]:
        """The program part of a launch command."""
        return (["-m", self.module] if self.module else [self.script]) + self.args




def _program(meta: dict, path: Path) -> tuple[str | None, str | None, list[str]]:
    cmd = [str(c) for c in (meta.get("command") or [])]
    if not cmd:
        raise EmulateInputError(f"{path}: records no command (the program and its arguments); capture the job "
                                "again with this prism")
    if cmd[0] in ("-m", "--module"):
        if len(cmd) < 2:
            raise EmulateInputError(f"{path}: command {cmd} names no module; capture the job again")
        return cmd[1], None, cmd[2:]
    return None, cmd[0], cmd[1:]


def _require(path: Path, fix: str) -> None:
    if not path.is_file():
        raise EmulateInputError(f"{path}: missing; {fix}")


def load(job_dir: str | Path) -> Job:
    """The job at `job_dir`, checked: captured with payloads, graph built, calibrated, all of one run."""
    job_dir = Path(job_dir)
    if not job_dir.is_dir():
        raise EmulateInputError(f"{job_dir}: no such job folder")
    cap, meta = job_files.find_capture(job_dir)  # checked once there: a capture's, with its payloads
    meta_path = job_files.meta_path(cap)
    for name in ("events", "comms", "groups", "ranks"):
        _require(job_files.graph_file(job_dir, name), f"build the graph first (`prism graph --job {job_dir}`)")
    calibrate = (f"the job is not calibrated: run `prism calibrate --job {job_dir}` (or the pipeline's target "
                 f"{job_files.calibrated(job_dir, 'timeline')})")
    for name in ("timeline", "iterations"):
        _require(job_files.calibrated(job_dir, name), calibrate)
    world = int(meta.get("world_size", -1))
    _same_run(job_dir, cap, meta, world)
    module, script, args = _program(meta, meta_path)
    return Job(job_dir, cap, meta, world, module, script, args)


def _same_run(job_dir: Path, cap: Path, meta: dict, world: int) -> None:
    """The graph and the calibration are of this capture (same run, same events)."""
    graph_events = job_files.graph_file(job_dir, "events")
    for path in (graph_events, job_files.graph_file(job_dir, "ranks"), job_files.calibrated(job_dir, "timeline")):
        artifacts.check_version(path)
    try:
        artifacts.same_run([job_files.raw_dir(cap), graph_events, job_files.graph_file(job_dir, "ranks"),
                            job_files.calibrated(job_dir, "timeline")])
    except artifacts.ArtifactError as exc:
        raise EmulateInputError(str(exc)) from None
    ranks = pq.read_table(job_files.graph_file(job_dir, "ranks"), columns=["rank", "n_events"])
    if ranks.num_rows != world:
        raise EmulateInputError(f"{job_files.graph_file(job_dir, 'ranks')}: {ranks.num_rows} ranks, but the "
                                f"capture {job_files.raw_dir(cap)} has {world}: the graph is of another job; "
                                "re-run `prism graph` and `prism calibrate` on this capture")
    expected = sum(ranks.column("n_events").to_pylist())
    n_graph = pq.ParquetFile(graph_events).metadata.num_rows
    n_timeline = pq.ParquetFile(job_files.calibrated(job_dir, "timeline")).metadata.num_rows
    if n_graph != expected or n_timeline != n_graph:
        raise EmulateInputError(
            f"{job_files.calibrated(job_dir, 'timeline')} has {n_timeline} events, {graph_events} {n_graph} "
            f"(ranks.parquet: {expected}): the calibration is of another graph; re-run `prism calibrate --job "
            f"{job_dir}`")


def check_ranks_captured(job: Job, ranks: list[int], n_events: dict[int, int]) -> None:
    """Each sandbox rank's capture stream has the events the graph says (else the graph is of another run)."""
    for r in ranks:
        path = job_files.rank_stream(job.capture, r)
        rows = artifacts.read_raw_stream(path).num_rows
        if rows != n_events[r]:
            raise EmulateInputError(f"{path}: {rows} events, but graph/ranks.parquet says rank {r} has "
                                    f"{n_events[r]}: the graph is of another capture; re-run `prism graph` and "
                                    "`prism calibrate`")


__all__ = ["EmulateInputError", "Job", "check_ranks_captured", "load"]
