"""Where a job's artifacts are: the path of every folder and file the stages, the runtime, the report and the
benchmarks read or write, in one place.

A job folder (``results/<job>/``, `JOB` below) holds ``capture/`` (the capture's run folder), ``graph/``,
``slices/``, ``calibrated/``, ``emulation/``, ``baseline/`` and ``report/``; a run folder (`RUN`: a capture,
a slice run, an emulation's launch, ``prism launch --out DIR``) holds ``raw/meta.json``,
``raw/rank=R/{events,groups,payloads}.arrow`` and ``payloads/``.

A neutral module: pathlib only, no import of prism's, so that the runtime (which may not import the analysis)
and the analysis (`prism.job` re-exports all of it) name the same paths.
"""

from __future__ import annotations

from pathlib import Path

META = "meta.json"  # a run's record, written by the launcher into RUN/raw (an emulation folder keeps a copy)


def table_file(folder: Path, name: str) -> Path:
    """FOLDER/NAME.parquet: one of the tables a stage writes into its folder."""
    return Path(folder) / f"{name}.parquet"


def stream_file(folder: Path, name: str) -> Path:
    """FOLDER/NAME.arrow: one of the raw Arrow streams a rank (or a replay worker or server) writes."""
    return Path(folder) / f"{name}.arrow"


def meta_file(folder: Path) -> Path:
    """FOLDER/meta.json: a raw folder's record of its run (or an emulation folder's copy of it)."""
    return Path(folder) / META


# -- where the artifacts are -----------------------------------------------------------------------------
def graph_dir(job: Path) -> Path:
    """JOB/graph: the graph stage's tables."""
    return Path(job) / "graph"


def graph_file(job: Path, name: str = "events") -> Path:
    """JOB/graph/NAME.parquet (events, comms, groups, ranks)."""
    return graph_table(graph_dir(job), name)


def graph_table(graph: Path, name: str = "events") -> Path:
    """GRAPH/NAME.parquet of a graph folder (`graph_dir`, or one a caller was handed)."""
    return table_file(graph, name)


CALIBRATED = "calibrated"  # the calibrate stage's output folder (the job's prediction)


def calibrated_dir(job: Path, folder: str = CALIBRATED) -> Path:
    """JOB/calibrated: the calibrate stage's output (another FOLDER: a calibration of the slices, a what-if)."""
    return Path(job) / folder


def calibrated(job: Path, name: str = "timeline", folder: str = CALIBRATED) -> Path:
    """JOB/FOLDER/NAME.parquet (timeline, iterations) of a calibrated folder."""
    return table_file(calibrated_dir(job, folder), name)


def emulation(job: Path, name: str | None = None) -> Path:
    """JOB/emulation (or a file in it)."""
    return Path(job) / "emulation" if name is None else Path(job) / "emulation" / name


def baseline(job: Path) -> Path:
    """JOB/baseline: the real run of the job (its own raw/ and graph/)."""
    return Path(job) / "baseline"


SLICES = "slices"  # the slice plan and the (untimed) slice runs
TIMED_SLICES = "slices_timed"  # the timed pass's slice runs (`prism slices run --timed-by`) and what they measured
UNTIMED_CALIBRATION = "calibrated_untimed"  # the untimed pass's calibration, which times the second pass


def slices_dir(job: Path, folder: str = SLICES) -> Path:
    """JOB/slices (or JOB/slices_timed): the slice runs of one pass and what they measured."""
    return Path(job) / folder


def slice_plan(job: Path) -> Path:
    return slices_dir(job) / "plan.parquet"


def slice_dir(job: Path, k: int, folder: str = SLICES) -> Path:
    """JOB/FOLDER/slice=K: a slice run's outputs."""
    return slices_dir(job, folder) / f"slice={k}"


def slice_file(job: Path, k: int, name: str = "events.parquet", folder: str = SLICES) -> Path:
    """JOB/FOLDER/slice=K/NAME: one of a slice run's outputs."""
    return slice_dir(job, k, folder) / name


def slice_files(job: Path, name: str = "events.parquet", folder: str = SLICES) -> list[Path]:
    """Every JOB/FOLDER/slice=K/NAME there is, sorted by path."""
    return sorted(slices_dir(job, folder).glob(f"slice=*/{name}"))


def own_durations(job: Path, folder: str = SLICES) -> Path:
    """JOB/FOLDER/durations.parquet: every event's measured duration (the slices' calibration)."""
    return slices_dir(job, folder) / "durations.parquet"


def slice_transfers(job: Path, folder: str = SLICES) -> Path:
    """JOB/FOLDER/transfers.parquet: every comm's transfer the slices measured."""
    return slices_dir(job, folder) / "transfers.parquet"


def summary(folder: Path) -> Path:
    """FOLDER/summary.txt: the text summary of a job (JOB), of its emulation or of its baseline."""
    return Path(folder) / "summary.txt"


def report_dir(job: Path) -> Path:
    """JOB/report: the report stage's output."""
    return Path(job) / "report"


def report(job: Path) -> Path:
    """JOB/report/report.html."""
    return report_dir(job) / "report.html"


def raw_dir(run: Path) -> Path:
    """RUN/raw: a run folder's raw streams (a capture, a slice run, an emulation's launch)."""
    return Path(run) / "raw"


def rank_dir(run: Path, rank: int) -> Path:
    """RUN/raw/rank=R: a rank's raw streams."""
    return raw_dir(run) / f"rank={rank}"


def rank_stream(run: Path, rank: int, name: str = "events.arrow") -> Path:
    """RUN/raw/rank=R/NAME: a rank's raw stream."""
    return rank_dir(run, rank) / name


def rank_streams(run: Path, name: str = "events.arrow") -> list[Path]:
    """Every RUN/raw/rank=R/NAME there is, by rank."""
    return sorted(raw_dir(run).glob(f"rank=*/{name}"), key=lambda p: int(p.parent.name.split("=")[1]))


def replay_stream(run: Path, name: str = "events.arrow") -> Path:
    """RUN/raw/replay/NAME: what a run's replay worker or server recorded."""
    return raw_dir(run) / "replay" / name


def meta_path(run: Path) -> Path:
    """RUN/raw/meta.json of a run folder."""
    return raw_meta(raw_dir(run))


def raw_meta(raw: Path) -> Path:
    """RAW/meta.json of a raw folder (the launcher's record of the run)."""
    return meta_file(raw)


def capture_dir(job: Path) -> Path:
    """JOB/capture: the capture's run folder in a job folder."""
    return Path(job) / "capture"


def payloads_dir(run: Path) -> Path:
    """RUN/payloads: a capture's content-addressed payloads."""
    return Path(run) / "payloads"


def capture_candidates(job: Path) -> list[Path]:
    """Where a job's capture may be: JOB/capture, or JOB itself (a bare capture folder)."""
    return [capture_dir(job), Path(job)]
