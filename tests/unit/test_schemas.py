"""`schemas/` holds exactly what `prism.schemas` defines (re-export with `python -m prism.schemas --export
schemas/`), and no column is named after an SQL reserved word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prism import schemas

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize("name", list(schemas.ALL))
def test_exported_schema_is_current(name):
    path = SCHEMAS_DIR / f"{name}.schema.json"
    assert path.is_file(), f"{path} missing: run `python -m prism.schemas --export schemas/`"
    assert json.loads(path.read_text()) == schemas.to_json(schemas.ALL[name]), (
        f"{path} is stale: run `python -m prism.schemas --export schemas/`"
    )


def test_no_stale_schema_files():
    exported = {p.name.removesuffix(".schema.json") for p in SCHEMAS_DIR.glob("*.schema.json")}
    assert exported == set(schemas.ALL)


def test_export_round_trip(tmp_path):
    written = schemas.export(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.schema.json" for n in schemas.ALL)
    assert schemas.main(["--export", str(tmp_path / "again")]) == 0


def test_with_version():
    meta = schemas.with_version(schemas.RANKS, rank=3).metadata
    assert meta[b"schema_version"] == schemas.SCHEMA_VERSION.encode() and meta[b"rank"] == b"3"


def test_graph_events_extend_raw_events():
    raw = [f.name for f in schemas.RAW_EVENTS]
    assert [f.name for f in schemas.EVENTS] == ["event_id", *raw, "comm_id", "op_event_id"]


def reserved_keywords() -> set[str]:
    """DuckDB's reserved keywords: a column named after one must be quoted in every query."""
    import duckdb

    return {k for (k,) in duckdb.sql("SELECT keyword_name FROM duckdb_keywords() "
                                     "WHERE keyword_category = 'reserved'").fetchall()}


def test_no_column_is_named_after_a_reserved_keyword():
    reserved = reserved_keywords()
    assert {"group", "desc", "order", "select"} <= reserved  # (the list is DuckDB's, not empty)
    bad = {name: [f.name for f in schema if f.name.lower() in reserved] for name, schema in schemas.ALL.items()}
    assert {name: cols for name, cols in bad.items() if cols} == {}


def test_groups_are_named_by_group_name_and_group_desc():
    for schema in (schemas.RAW_EVENTS, schemas.EVENTS, schemas.COMMS, schemas.SLICE_EVENTS, schemas.EMULATION_EVENTS):
        assert "group_name" in schema.names
    for schema in (schemas.RAW_GROUPS, schemas.GROUPS):
        assert {"group_name", "group_desc"} <= set(schema.names)
