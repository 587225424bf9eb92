"""Reading and writing artifacts: the helpers every stage shares.

Writes are atomic (temp name in the same folder, then ``os.replace``) and stamp ``schema_version`` into
the Parquet key-value metadata; reads check it. A stage that writes several tables uses `write_outputs`,
so that a failed stage leaves either all of its outputs or none of them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from prism import schemas


class ArtifactError(ValueError):
    """An artifact is missing, unreadable or inconsistent; the message says which file and why."""


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, order and types, plus ``schema_version`` metadata."""
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ArtifactError(f"table lacks columns {missing} required by the schema")
    versioned = schemas.with_version(schema)
    return table.select(schema.names).cast(versioned)


def write_parquet(table: pa.Table, path: str | Path, schema: pa.Schema) -> Path:
    """Cast `table` to `schema` and write it to `path` atomically, with ``schema_version`` metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _temp_name(path)
    try:
        pq.write_table(conform(table, schema), temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def write_outputs(
    folder: str | Path,
    tables: Mapping[str, pa.Table],
    table_schemas: Mapping[str, pa.Schema] | None = None,
) -> list[Path]:
    """Write ``folder/<name>.parquet`` for every table, all or none.

    Each table is cast to ``table_schemas[name]`` (default: ``prism.schemas.ALL[name]``). A new folder is
    built under a temp name and renamed into place, so it appears whole; into an existing folder, every
    table is written to a temp file first and the renames happen only once all writes succeeded.
    """
    folder = Path(folder)
    table_schemas = table_schemas or schemas.ALL
    conformed = {name: conform(table, table_schemas[name]) for name, table in tables.items()}
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = _temp_name(folder)
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed process of the same pid
        staging.mkdir()
        try:
            for name, table in conformed.items():
                pq.write_table(table, staging / f"{name}.parquet")
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return [folder / f"{name}.parquet" for name in conformed]
    temps: dict[Path, Path] = {}
    try:
        for name, table in conformed.items():
            path = folder / f"{name}.parquet"
            temps[path] = _temp_name(path)
            pq.write_table(table, temps[path])
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
    missing = [name for name in schema.names if name not in table.column_names]
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
        "re-run the stage that wrote it with this prism"
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
        raise ArtifactError(f"{path}: unreadable ({exc})") from exc
    if found != schemas.SCHEMA_VERSION:
        raise _version_error(path, found)


def read_parquet(path: str | Path) -> pa.Table:
    """Read a Parquet artifact after checking its schema version."""
    check_version(path)
    return pq.read_table(path)
