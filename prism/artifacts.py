"""Reading and writing artifacts: the helpers every stage shares.

Writes are atomic (temp name in the same folder, then ``os.replace``) and stamp ``schema_version`` and
``prism.run_id`` (the run the data comes from: ``raw/meta.json``'s ``run_id``, carried through every stage)
into the Parquet key-value metadata, with page checksums. Reads check the version and the checksums, and
name the file and the stage that rewrites it when it is unreadable (`read_parquet`). `same_run` checks that
a stage's inputs come from one run. A stage that writes several tables uses `write_outputs`, so that a
failed stage leaves either all of its outputs or none of them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from prism import job_paths, schemas


RUN_ID_KEY = b"prism.run_id"


class ArtifactError(ValueError):
    """An artifact is missing, unreadable or inconsistent; the message says which file and why."""


def writer_of(path: str | Path) -> str:
    """The command that (re)writes the artifact at `path`, from where it sits in a job folder."""
    path = Path(path)
    if "raw" in path.parts[-3:]:  # raw/meta.json, raw/rank=R/events.arrow
        return "the capture or baseline run that wrote it (the pipeline's capture / baseline_run rule)"
    folder = path.parent
    job = folder.parent
    if folder.name.startswith("slice="):
        timed = " --timed-by JOB/calibrated_untimed/timeline.parquet" if job.name == "slices_timed" else ""
        return f"prism slices run --job {job.parent} --slice {folder.name.split('=', 1)[1]}{timed}"
    if folder.name == "graph":
        return f"prism graph --job {job}"
    if folder.name in ("calibrated", "calibrated_untimed"):
        return f"prism calibrate --job {job} --durations ... --transfers ... --out {folder}"
    if folder.name == "slices_timed" and path.stem in ("durations", "transfers"):
        return f"prism slices durations --job {job} --slices slices_timed"
    if folder.name == "slices" and path.stem == "plan":
        return f"prism slices plan --job {job} --devices P"
    if folder.name == "slices" and path.stem in ("durations", "transfers"):
        return f"prism slices durations --job {job}"
    if folder.name == "emulation":
        return f"prism emulate --job {job} --force"
    return "the stage that writes it"


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def conform(table: pa.Table, schema: pa.Schema, run_id: str) -> pa.Table:
    """`table` with exactly `schema`'s columns, order and types, plus ``schema_version`` and
    ``prism.run_id`` metadata."""
    present = set(table.column_names)
    missing = [name for name in schema.names if name not in present]
    if missing:
        raise ArtifactError(f"table lacks columns {missing} required by the schema")
    if not run_id:
        raise ValueError("an artifact needs the run id of the data it comes from")
    versioned = schemas.with_version(schema)
    versioned = versioned.with_metadata({**(versioned.metadata or {}), RUN_ID_KEY: run_id.encode()})
    return table.select(schema.names).cast(versioned)


def check_timeline(table: pa.Table, path: Path) -> None:
    """`schemas.check_timeline` on a table about to be written to `path`, as an `ArtifactError` (nothing written)."""
    try:
        schemas.check_timeline(table, str(path))
    except schemas.TimelineError as exc:
        raise ArtifactError(f"{exc}; nothing was written (a defect of the stage that writes it: "
                            f"{writer_of(path)})") from None


def _write_table(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path, write_page_checksum=True)


def write_parquet(table: pa.Table, path: str | Path, schema: pa.Schema, *, run_id: str) -> Path:
    """Cast `table` to `schema` and write it to `path` atomically, with ``schema_version`` and run id."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_name(path)
    table = conform(table, schema, run_id)
    check_timeline(table, path)
    try:
        _write_table(table, temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def write_outputs(
    folder: str | Path,
    tables: Mapping[str, pa.Table],
    table_schemas: Mapping[str, pa.Schema] | None = None,
    *,
    run_id: str,
) -> list[Path]:
    """Write ``folder/<name>.parquet`` for every table, all or none, stamped with `run_id`.

    Each table is cast to ``table_schemas[name]`` (default: ``prism.schemas.ALL[name]``). A new folder is
    built under a temp name and renamed into place, so it appears whole; into an existing folder, every
    table is written to a temp file first and the renames happen only once all writes succeeded.
    """
    folder = Path(folder)
    table_schemas = table_schemas or schemas.ALL
    conformed = {name: conform(table, table_schemas[name], run_id) for name, table in tables.items()}
    for name, table in conformed.items():
        check_timeline(table, job_paths.table_file(folder, name))
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = _temp_name(folder)
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed process of the same pid
        staging.mkdir()
        try:
            for name, table in conformed.items():
                _write_table(table, job_paths.table_file(staging, name))
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return [job_paths.table_file(folder, name) for name in conformed]
    temps: dict[Path, Path] = {}
    try:
        for name, table in conformed.items():
            path = job_paths.table_file(folder, name)
            temps[path] = _temp_name(path)
            _write_table(table, temps[path])
        for path, temp in temps.items():
            os.replace(temp, path)
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
    return list(temps)


def read_raw_stream(path: str | Path, schema: pa.Schema | None = None) -> pa.Table:
    """Read an Arrow IPC stream (a raw per-rank stream) into one table.

    With `schema`, check that every field is present and cast to it. A truncated or corrupt stream (a
    rank killed while writing) raises `ArtifactError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        if path.with_name(path.name + ".tmp").exists():
            raise ArtifactError(
                f"{path}: missing, only {path.name}.tmp exists: the rank was killed before closing its "
                "stream; see its log and re-run the capture"
            )
        raise ArtifactError(f"{path}: missing raw stream (the rank did not start, or wrote elsewhere)")
    try:
        with pa.OSFile(str(path)) as source:
            table = ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ArtifactError(
            f"{path}: truncated or corrupt Arrow IPC stream ({detail}); the rank was probably killed "
            "while writing it: re-run the capture"
        ) from exc
    _check_stream_version(path, table.schema)
    if schema is None:
        return table
    present = set(table.column_names)
    missing = [name for name in schema.names if name not in present]
    if missing:
        raise ArtifactError(f"{path}: lacks columns {missing}; written by an incompatible prism runtime")
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ArtifactError(f"{path}: columns do not match the raw schema ({exc})") from exc


def _check_stream_version(path: Path, schema: pa.Schema) -> None:
    found = (schema.metadata or {}).get(b"schema_version")
    if found is not None and found.decode() != schemas.SCHEMA_VERSION:
        raise _version_error(path, found.decode())


def _version_error(path: Path, found: str | None) -> ArtifactError:
    return ArtifactError(
        f"{path}: schema_version {found!r}, this prism reads {schemas.SCHEMA_VERSION!r}; "
        f"re-run the stage that wrote it with this prism ({writer_of(path)})"
        + ("; or rename its columns in place: python -m prism.schema_upgrade JOB_FOLDER" if found == "1" else "")
    )


def read_version(path: str | Path) -> str | None:
    """The ``schema_version`` an artifact declares (Parquet/Arrow metadata, or a JSON key), or None."""
    path = Path(path)
    if path.suffix == ".json":
        return json.loads(path.read_text()).get("schema_version")
    if path.suffix == ".parquet":
        meta = pq.read_schema(path).metadata or {}
    else:
        with pa.OSFile(str(path)) as source:
            meta = ipc.open_stream(source).schema.metadata or {}
    value = meta.get(b"schema_version")
    return None if value is None else value.decode()


def check_version(path: str | Path) -> None:
    """Raise `ArtifactError` unless the artifact at `path` declares this prism's schema version."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: missing artifact (run the stage that writes it)")
    try:
        found = read_version(path)
    except (pa.ArrowInvalid, OSError, json.JSONDecodeError) as exc:
        raise _unreadable(path, exc) from exc
    if found != schemas.SCHEMA_VERSION:
        raise _version_error(path, found)


def _unreadable(path: Path, exc: BaseException) -> ArtifactError:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ArtifactError(f"{path}: unreadable or corrupt ({detail}); re-run the stage that writes it: "
                         f"{writer_of(path)}")


def read_parquet(path: str | Path, columns: Sequence[str] | None = None, *, versioned: bool = True) -> pa.Table:
    """Read a Parquet artifact (all columns, or `columns`) after checking its schema version (with
    ``versioned=False``, a table without one, e.g. made by hand, is read too); page checksums are
    verified, and a corrupt file raises `ArtifactError` naming it and the stage to re-run."""
    path = Path(path)
    if versioned:
        check_version(path)
    elif not path.is_file():
        raise ArtifactError(f"{path}: missing artifact (run the stage that writes it: {writer_of(path)})")
    try:
        return pq.read_table(path, columns=list(columns) if columns is not None else None,
                             page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from exc


def verify_parquet(path: str | Path) -> None:
    """Read every page of a Parquet file (one row group at a time), raising `ArtifactError` if any is corrupt."""
    path = Path(path)
    try:
        reader = pq.ParquetFile(path, page_checksum_verification=True)
        for i in range(reader.num_row_groups):
            reader.read_row_group(i)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from exc


def first_unreadable(folder: str | Path) -> ArtifactError | None:
    """After a read failed deep inside a stage (polars, DuckDB): the first Parquet artifact under `folder`
    that cannot be read (truncated, zero-byte, zeroed, a corrupt page), named with the command that rewrites
    it; None when every one reads."""
    for path in sorted(Path(folder).rglob("*.parquet")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue  # another run's staging
        try:
            verify_parquet(path)
        except ArtifactError as exc:
            return exc
    return None


def stage_error(prog: str, job: str | Path, out: str | Path | None, exc: Exception) -> int:
    """The one line a stage that reads a job folder and writes `out` prints for `exc`, and its exit code (2):
    an artifact error as it is, an unwritable `out` with the fix, a failure deep inside a reader (polars,
    pyarrow) as the first damaged artifact under `job`. Anything else is re-raised: it is prism's bug."""
    import sys

    if isinstance(exc, ArtifactError):
        message = str(exc)
    elif isinstance(exc, OSError):
        message = (f"cannot write {exc.filename or out} ({exc.strerror}); choose a path in a writable folder")
    else:
        found = first_unreadable(job)
        if found is None:
            raise exc
        message = str(found)
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def check_out(out: str | Path, folder: bool = False, option: str = "--out", example: str = "report.html") -> Path:
    """The path a stage is about to write (a file, or with `folder=True` a folder): refuse one of the other
    kind (a folder given for a file is answered with `example`, the file name to give), or a parent folder
    that cannot be made or written, with the fix; returns it."""
    out = Path(out)
    if not folder and out.is_dir():
        raise ArtifactError(f"{option} {out} is a folder: give a file name (e.g. {out / example})")
    if folder and out.exists() and not out.is_dir():
        raise ArtifactError(f"{option} {out} is a file: give a folder (new, or one prism wrote before)")
    existing = next(p for p in out.absolute().parents if p.exists())  # made when written, not before
    if not existing.is_dir():
        raise ArtifactError(f"{option} {out}: cannot create {out.parent} ({existing} is a file); choose a path "
                            "in a writable folder")
    if not os.access(existing, os.W_OK) or (existing != out.parent.absolute() and _read_only_fs(existing)):
        raise ArtifactError(f"{option} {out}: cannot create {out.parent} ({existing} is not writable); choose a "
                            "path in a writable folder")
    return out


def _read_only_fs(folder: Path) -> bool:
    """A folder that `access` calls writable for root where no folder can be made (/sys, /proc, a read-only
    mount)."""
    try:
        os.statvfs(folder)
    except OSError:
        return True
    probe = folder / f".prism-write-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return True
    probe.rmdir()
    return False


# ------------------------------------------------------------------------------------------------ run ids


def read_run_id(path: str | Path) -> str | None:
    """The run an artifact comes from: ``prism.run_id`` of a Parquet file, ``run_id`` of a ``meta.json``
    (a raw folder: its ``meta.json``); None when it declares none."""
    path = Path(path)
    if path.is_dir():
        path = job_paths.raw_meta(path)
    if not path.exists():
        raise ArtifactError(f"{path}: missing artifact (run the stage that writes it: {writer_of(path)})")
    try:
        if path.suffix == ".json":
            value = json.loads(path.read_text()).get("run_id")
            return None if value is None else str(value)
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError, json.JSONDecodeError, AttributeError) as exc:
        raise _unreadable(path, exc) from exc
    value = meta.get(RUN_ID_KEY)
    return None if value is None else value.decode()


def is_prism_artifact(path: str | Path) -> bool:
    """Whether a Parquet file was written by prism (declares a ``schema_version``), not by hand."""
    try:
        return b"schema_version" in (pq.read_schema(path).metadata or {})
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(Path(path), exc) from exc


def _stale_of(a: Path, b: Path) -> Path:
    """Of two artifacts of different runs, the one to rewrite: not the capture's own record (raw/meta.json),
    which every later stage derives from (a folder copied in from another run has a new time, so the time
    alone blamed the capture); otherwise the older file."""
    def is_capture(path: Path) -> bool:
        return path == job_paths.meta_path(path.parent.parent)  # RUN/raw/meta.json

    if is_capture(a) != is_capture(b):
        return b if is_capture(a) else a
    return min((a, b), key=lambda p: p.stat().st_mtime)


def same_run(inputs: Sequence[str | Path]) -> str:
    """The one run id the artifacts `inputs` share; `ArtifactError` when one declares none (written by an
    older prism) or two come from different runs (naming both files and the stage to re-run)."""
    found: list[tuple[Path, str]] = []
    for path in map(Path, inputs):
        path = job_paths.raw_meta(path) if path.is_dir() else path  # a raw folder: its meta.json
        run_id = read_run_id(path)
        if run_id is None:
            raise ArtifactError(
                f"{path}: no run id (written by an older prism): re-run the pipeline from the capture "
                "(snakemake ... --forceall, or the stages by hand from the capture on)")
        found.append((path, run_id))
    if not found:
        raise ValueError("same_run needs at least one input")
    first_path, first = found[0]
    for path, run_id in found[1:]:
        if run_id != first:
            stale = _stale_of(first_path, path)
            raise ArtifactError(
                f"{first_path} (run {first}) and {path} (run {run_id}) come from different runs: the older one, "
                f"{stale}, is stale; re-run from the stage that writes it ({writer_of(stale)}) and the stages "
                "after it, or start the job again in a new folder")
    return first
