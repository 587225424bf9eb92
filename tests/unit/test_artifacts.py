"""Shared artifact helpers: atomic versioned writes, all-or-none outputs, raw stream reading."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from prism import schemas
from prism import artifacts
from prism.artifacts import ArtifactError, check_version, read_parquet, read_raw_stream, write_outputs, write_parquet

RANKS_ROW = {"rank": 0, "node": "h", "tp": 0, "pp": -1, "dp": 0, "ep": -1, "n_events": 3, "iterations": 1,
             "iteration_rule": "outermost optimizer step", "microbatch_rule": "forward of a module with trainable parameters"}


def test_write_parquet_casts_and_versions(tmp_path):
    table = pa.Table.from_pylist([RANKS_ROW])  # int64 columns, other order than the schema
    path = write_parquet(table.select(list(reversed(table.column_names))), tmp_path / "a" / "ranks.parquet",
                         schemas.RANKS, run_id="r1")
    assert pq.read_schema(path).remove_metadata().equals(schemas.RANKS)
    check_version(path)
    assert read_parquet(path).to_pylist() == [RANKS_ROW]
    assert [p.name for p in path.parent.iterdir()] == ["ranks.parquet"]


def test_write_outputs_all_or_none(tmp_path):
    good = pa.Table.from_pylist([RANKS_ROW])
    bad = pa.table({"group_name": ["g"]})  # lacks columns of GROUPS
    with pytest.raises(ArtifactError):
        write_outputs(tmp_path / "graph", {"ranks": good, "groups": bad}, run_id="r1")
    assert not list(tmp_path.iterdir())
    write_outputs(tmp_path / "graph", {"ranks": good}, run_id="r1")
    before = (tmp_path / "graph" / "ranks.parquet").read_bytes()
    with pytest.raises(ArtifactError):
        write_outputs(tmp_path / "graph", {"ranks": good.drop(["node"])}, run_id="r1")
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


def _corrupt_data_page(path, column: int | None = None) -> None:
    """Flip bytes in the second half of a column chunk (default: the largest) of the first row group; the
    footer stays intact."""
    group = pq.read_metadata(path).row_group(0)
    if column is None:
        column = max(range(group.num_columns), key=lambda i: group.column(i).total_compressed_size)
    chunk = group.column(column)
    data = bytearray(path.read_bytes())
    first = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    start, end = chunk.data_page_offset, first + chunk.total_compressed_size
    for i in range((start + end) // 2, end - 4):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_corrupt_data_page_names_the_file_and_the_stage(tmp_path):
    rows = [{**RANKS_ROW, "rank": r, "node": f"host-{r % 7}", "n_events": r * 31} for r in range(5000)]
    path = write_parquet(pa.Table.from_pylist(rows), tmp_path / "job" / "graph" / "ranks.parquet", schemas.RANKS,
                         run_id="r1")
    _corrupt_data_page(path, column=schemas.RANKS.names.index("n_events"))
    pq.read_metadata(path)  # the footer still reads
    for read in (read_parquet, artifacts.verify_parquet):
        with pytest.raises(ArtifactError) as err:
            read(path)
        assert str(path) in str(err.value) and f"prism graph --job {tmp_path / 'job'}" in str(err.value)


def test_writer_of_names_real_commands(tmp_path):
    job = tmp_path / "j"
    assert artifacts.writer_of(job / "slices" / "slice=3" / "events.parquet") == \
        f"prism slices run --job {job} --slice 3"
    assert artifacts.writer_of(job / "slices" / "plan.parquet").startswith(f"prism slices plan --job {job}")
    assert artifacts.writer_of(job / "slices" / "durations.parquet") == \
        f"prism slices durations --job {job}"
    assert artifacts.writer_of(job / "calibrated" / "timeline.parquet").startswith(f"prism calibrate --job {job}")


def test_run_ids_are_stamped_and_compared(tmp_path):
    good = pa.Table.from_pylist([RANKS_ROW])
    a = write_parquet(good, tmp_path / "job" / "graph" / "ranks.parquet", schemas.RANKS, run_id="aaaa")
    b = write_parquet(good, tmp_path / "job" / "calibrated" / "ranks.parquet", schemas.RANKS, run_id="aaaa")
    meta = tmp_path / "job" / "raw" / "meta.json"
    meta.parent.mkdir()
    meta.write_text(json.dumps({"run_id": "aaaa"}))
    assert pq.read_schema(a).metadata[b"prism.run_id"] == b"aaaa"
    assert artifacts.same_run([meta.parent, a, b]) == "aaaa"
    import os

    os.utime(a, (1, 1))  # the graph is older than the newer run's files: it is the stale one
    write_parquet(good, b, schemas.RANKS, run_id="bbbb")
    with pytest.raises(ArtifactError) as err:
        artifacts.same_run([a, b])
    text = str(err.value)
    assert str(a) in text and str(b) in text and "aaaa" in text and "bbbb" in text
    assert f"is stale; re-run from the stage that writes it (prism graph --job {tmp_path / 'job'})" in text
    old = tmp_path / "old.parquet"
    pq.write_table(pa.table({"a": [1]}).replace_schema_metadata({"schema_version": schemas.SCHEMA_VERSION}), old)
    with pytest.raises(ArtifactError, match="no run id .written by an older prism"):
        artifacts.same_run([a, old])
    with pytest.raises(ValueError):
        write_parquet(good, b, schemas.RANKS, run_id="")


def test_a_job_folder_of_the_old_schema_is_refused_with_the_stage_to_rerun(tmp_path, capsys):
    """Schema version 1 named a process group `group` / `desc` (SQL keywords); version 2 `group_name` /
    `group_desc`. A graph written by the older prism is refused by name (re-run it), never a KeyError."""
    from prism import graph
    from prism.calibrate import stage
    from rawgen import megatron_job

    megatron_job(tp=2, dp=2, iterations=2).write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    for name in ("events", "comms", "groups"):
        path = tmp_path / "graph" / f"{name}.parquet"
        table = pq.read_table(path)
        renamed = {"group_name": "group", "group_desc": "desc"}
        old = table.rename_columns([renamed.get(c, c) for c in table.column_names])
        pq.write_table(old.replace_schema_metadata({**table.schema.metadata, b"schema_version": b"1"}), path)
    capsys.readouterr()
    assert stage.main(["--job", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert f"schema_version '1', this prism reads '{schemas.SCHEMA_VERSION}'" in err and "re-run" in err, err
    assert "KeyError" not in err and not (tmp_path / "calibrated" / "timeline.parquet").exists()
    assert "python -m prism.schema_upgrade" in err

    # the upgrade renames the columns in place (values and run id kept); then the stage reads the folder
    from prism import schema_upgrade

    before = pq.read_table(tmp_path / "graph" / "groups.parquet")
    assert schema_upgrade.main([str(tmp_path)]) == 0
    after = pq.read_table(tmp_path / "graph" / "groups.parquet")
    assert after.column_names == schemas.GROUPS.names
    assert after["group_desc"].to_pylist() == before["desc"].to_pylist()
    assert after.schema.metadata[b"prism.run_id"] == before.schema.metadata[b"prism.run_id"]
    assert stage.main(["--job", str(tmp_path)]) == 0
    assert "upgraded" not in schema_upgrade.upgrade(tmp_path)  # a second run changes nothing
