"""Shared artifact helpers: atomic versioned writes, all-or-none outputs, raw stream reading."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from prism import schemas
from prism.artifacts import ArtifactError, check_version, read_parquet, read_raw_stream, write_outputs, write_parquet

RANKS_ROW = {"rank": 0, "node": "h", "tp": 0, "pp": -1, "dp": 0, "ep": -1, "n_events": 3, "iterations": 1}


def test_write_parquet_casts_and_versions(tmp_path):
    table = pa.Table.from_pylist([RANKS_ROW])  # int64 columns, other order than the schema
    path = write_parquet(table.select(list(reversed(table.column_names))), tmp_path / "a" / "ranks.parquet", schemas.RANKS)
    assert pq.read_schema(path).remove_metadata().equals(schemas.RANKS)
    check_version(path)
    assert read_parquet(path).to_pylist() == [RANKS_ROW]
    assert [p.name for p in path.parent.iterdir()] == ["ranks.parquet"]


def test_write_outputs_all_or_none(tmp_path):
    good = pa.Table.from_pylist([RANKS_ROW])
    bad = pa.table({"group": ["g"]})  # lacks columns of GROUPS
    with pytest.raises(ArtifactError):
        write_outputs(tmp_path / "graph", {"ranks": good, "groups": bad})
    assert not list(tmp_path.iterdir())
    write_outputs(tmp_path / "graph", {"ranks": good})
    before = (tmp_path / "graph" / "ranks.parquet").read_bytes()
    with pytest.raises(ArtifactError):
        write_outputs(tmp_path / "graph", {"ranks": good.drop(["node"])})
    assert (tmp_path / "graph" / "ranks.parquet").read_bytes() == before
    assert [p.name for p in (tmp_path / "graph").iterdir()] == ["ranks.parquet"]


def test_check_version(tmp_path):
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    with pytest.raises(ArtifactError, match="schema_version None"):
        check_version(path)
    pq.write_table(pa.table({"a": [1]}).replace_schema_metadata({"schema_version": "0"}), path)
    with pytest.raises(ArtifactError, match=str(path)):
        check_version(path)
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"schema_version": schemas.SCHEMA_VERSION}))
    check_version(meta)
    with pytest.raises(ArtifactError, match="missing"):
        check_version(tmp_path / "nope.parquet")


def _stream(path, batches: int):
    schema = pa.schema([("a", pa.int64())])
    with ipc.new_stream(path, schema) as writer:
        for k in range(batches):
            writer.write_batch(pa.record_batch([pa.array(range(k * 100, k * 100 + 100))], schema=schema))


def test_read_raw_stream(tmp_path):
    path = tmp_path / "events.arrow"
    _stream(path, 3)
    assert read_raw_stream(path).column("a").to_pylist() == list(range(300))
    data = path.read_bytes()
    path.write_bytes(data[:-300])
    with pytest.raises(ArtifactError, match="truncated"):
        read_raw_stream(path)
    path.write_bytes(b"")
    with pytest.raises(ArtifactError, match=str(path)):
        read_raw_stream(path)
    with pytest.raises(ArtifactError, match="lacks columns"):
        _stream(path, 1)
        read_raw_stream(path, schemas.RAW_GROUPS)
