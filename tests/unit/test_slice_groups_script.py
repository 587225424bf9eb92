"""scripts/frameworks/slice_groups.py: the all-slice groups of a slice plan, by slice (a device script's step)."""

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "frameworks" / "slice_groups.py"


def _module():
    spec = importlib.util.spec_from_file_location("slice_groups", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job(tmp_path: Path) -> Path:
    (tmp_path / "slices").mkdir()
    (tmp_path / "graph").mkdir()
    pq.write_table(pa.table({"slice": [0, 0, 1, 1], "rank": [0, 1, 2, 3]}), tmp_path / "slices" / "plan.parquet")
    pq.write_table(pa.table({"group_desc": ["default_pg", "mesh_tp", "mesh_tp", "mesh_dp", "mesh_dp", "self"],
                             "size": [4, 2, 2, 2, 2, 1],
                             "members": [[0, 1, 2, 3], [0, 1], [2, 3], [0, 2], [1, 3], [3]]}),
                   tmp_path / "graph" / "groups.parquet")
    return tmp_path


def test_lists_each_slices_groups_that_lie_wholly_inside_it(tmp_path, capsys):
    assert _module().main(_job(tmp_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["0\t[0, 1]\tmesh_tp: [0, 1]", "1\t[2, 3]\tmesh_tp: [2, 3]"]  # not the 1-member group


def test_a_slice_with_no_such_group_says_none(tmp_path, capsys):
    job = _job(tmp_path)
    pq.write_table(pa.table({"slice": [0, 0, 1, 1], "rank": [0, 2, 1, 3]}), job / "slices" / "plan.parquet")
    assert _module().main(job) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["0\t[0, 2]\tmesh_dp: [0, 2]", "1\t[1, 3]\tmesh_dp: [1, 3]"]
    pq.write_table(pa.table({"slice": [0, 1, 2, 3], "rank": [0, 1, 2, 3]}), job / "slices" / "plan.parquet")
    assert _module().main(job) == 0
    assert all(line.endswith("\tnone") for line in capsys.readouterr().out.splitlines()[1:])


def test_a_missing_artifact_names_the_stage_to_run(tmp_path, capsys):
    assert _module().main(tmp_path) == 2
    err = capsys.readouterr().err
    assert "plan.parquet missing" in err and "prism slices plan" in err
