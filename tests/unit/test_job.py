"""The job facade (`prism.job`): a capture found and its meta.json checked once, with one clear error each."""

from __future__ import annotations

import json

import pytest

from prism import job as job_files
from prism import schemas


def _capture(folder, **meta):
    (folder / "raw").mkdir(parents=True)
    (folder / "raw" / "meta.json").write_text(json.dumps({"world_size": 4, "mode": "capture", "payloads": True,
                                                          "schema_version": schemas.SCHEMA_VERSION, **meta}))
    (folder / "payloads").mkdir()
    return folder


def test_a_jobs_capture_is_found_in_capture_or_in_the_folder_itself(tmp_path):
    cap = _capture(tmp_path / "job" / "capture")
    assert job_files.find_capture(tmp_path / "job") == (cap, json.loads(job_files.meta_path(cap).read_text()))
    bare = _capture(tmp_path / "bare")
    assert job_files.find_capture(bare)[0] == bare


@pytest.mark.parametrize("meta, words", [
    (dict(mode="slice"), "a 'slice' run, not a capture"),
    (dict(payloads=False), "no payloads/"),
    (dict(world_size=0), "world_size must be a positive integer"),
    (dict(schema_version="0"), f"schema_version '0', this prism reads '{schemas.SCHEMA_VERSION}'"),
])
def test_a_capture_that_cannot_be_replayed_is_named(tmp_path, meta, words):
    _capture(tmp_path / "capture", **meta)
    with pytest.raises(job_files.JobError, match=words):
        job_files.find_capture(tmp_path)


def test_no_capture_and_broken_json_name_the_file(tmp_path):
    with pytest.raises(job_files.JobError, match="no capture .*capture/raw/meta.json.* are missing"):
        job_files.find_capture(tmp_path)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "meta.json").write_text("{")
    with pytest.raises(job_files.JobError, match="meta.json: not valid JSON"):
        job_files.read_meta(tmp_path)


def test_artifact_paths():
    from pathlib import Path

    job = Path("results/j")
    assert job_files.graph_file(job, "comms") == job / "graph" / "comms.parquet"
    assert job_files.calibrated(job, "iterations", "whatif") == job / "whatif" / "iterations.parquet"
    assert job_files.slice_file(job, 3) == job / "slices" / "slice=3" / "events.parquet"
    assert job_files.meta_path(job / "capture") == job / "capture" / "raw" / "meta.json"
