"""Upgrade a folder of artifacts written by an older prism to this one's schema version, in place.

    python -m prism.schema_upgrade DIR [DIR ...]

Schema version 1 named a process group's columns ``group`` and ``desc``, SQL keywords that every DuckDB query
had to quote; version 2 names them ``group_name`` (torch's name of the process group) and ``group_desc`` (the
program's ``group_desc``), and nothing else changed. This renames those columns in every Parquet artifact and
raw Arrow stream under DIR that declares ``schema_version`` 1, and the key in every ``meta.json``, and stamps
version 2; values, the other metadata (``prism.run_id``) and row order are kept, so a stage reads the folder as
if this prism had written it. Each file is rewritten atomically (temp name, then rename). A file of another
version is left alone and named (re-run the stage that wrote it); files without a version (not prism's) are
skipped. Run it on a job folder a stage refused with "schema_version '1'", or re-run the stages instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from prism import schemas

RENAMED = {"1": {"group": "group_name", "desc": "group_desc"}}  # old version -> {old column: new column}


def _upgraded(table: pa.Table, version: str) -> pa.Table:
    names = [RENAMED[version].get(c, c) for c in table.column_names]
    meta = {**(table.schema.metadata or {}), b"schema_version": schemas.SCHEMA_VERSION.encode()}
    return table.rename_columns(names).replace_schema_metadata(meta)


def _replace(path: Path, write) -> None:
    temp = path.with_name(f".{path.name}.upgrade-{os.getpid()}")
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def upgrade_file(path: Path) -> str:
    """Upgrade one artifact; returns what was done: 'upgraded', 'current', 'unversioned' or 'refused: ...'."""
    if path.suffix == ".json":
        meta = json.loads(path.read_text())
        found = meta.get("schema_version") if isinstance(meta, dict) else None
    elif path.suffix == ".parquet":
        found = (pq.read_schema(path).metadata or {}).get(b"schema_version")
    else:
        with pa.OSFile(str(path)) as source:
            found = (ipc.open_stream(source).schema.metadata or {}).get(b"schema_version")
    found = found.decode() if isinstance(found, bytes) else found
    if found is None:
        return "unversioned"
    if found == schemas.SCHEMA_VERSION:
        return "current"
    if found not in RENAMED:
        return f"refused: schema_version {found!r} has no upgrade; re-run the stage that wrote it"
    if path.suffix == ".json":
        text = json.dumps({**meta, "schema_version": schemas.SCHEMA_VERSION}, indent=2) + "\n"
        _replace(path, lambda temp: temp.write_text(text))
    elif path.suffix == ".parquet":
        table = _upgraded(pq.read_table(path), found)
        _replace(path, lambda temp: pq.write_table(table, temp, write_page_checksum=True))
    else:
        with pa.OSFile(str(path)) as source:
            table = _upgraded(ipc.open_stream(source).read_all(), found)

        def write(temp: Path) -> None:
            with ipc.new_stream(str(temp), table.schema) as writer:
                writer.write_table(table)
        _replace(path, write)
    return "upgraded"


def artifacts_under(folder: Path) -> list[Path]:
    """prism's artifact files under `folder`: Parquet tables, raw Arrow streams and meta.json files."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and (p.suffix in (".parquet", ".arrow") or p.name == "meta.json"))


def upgrade(folder: Path) -> dict[str, list[Path]]:
    """Upgrade every artifact under `folder`; {outcome: files}."""
    done: dict[str, list[Path]] = {}
    for path in artifacts_under(folder):
        done.setdefault(upgrade_file(path), []).append(path)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.schema_upgrade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="job folders (or any folder of artifacts)")
    args = parser.parse_args(argv)
    refused = 0
    for folder in args.folders:
        if not folder.is_dir():
            print(f"prism schema_upgrade: error: {folder}: not a folder", file=sys.stderr)
            return 2
        done = upgrade(folder)
        for outcome, paths in sorted(done.items()):
            if outcome.startswith("refused"):
                refused += len(paths)
                for path in paths:
                    print(f"prism schema_upgrade: {path}: {outcome}", file=sys.stderr)
        print(f"{folder}: {len(done.get('upgraded', []))} upgraded to schema_version {schemas.SCHEMA_VERSION}, "
              f"{len(done.get('current', []))} already current, {len(done.get('unversioned', []))} not prism's")
    return 2 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
