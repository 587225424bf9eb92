"""A Parquet artifact whose data pages are corrupt (footer intact): every stage that reads it names the file
and the command that rewrites it, exit 2, and writes nothing."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from prism import artifacts, graph, schemas, summary
from prism.calibrate import from_slices, stage
from prism.slices import plan
from rawgen import megatron_job
from test_artifacts import _corrupt_data_page


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A job through every stage: graph, plan, slice events (the graph's own rows), durations, calibration."""
    folder = tmp_path_factory.mktemp("corrupt") / "job"
    megatron_job(tp=2, dp=2, iterations=3).write(folder)
    assert graph.main(["--job", str(folder)]) == 0
    assert plan.main(["--job", str(folder), "--devices", "2"]) == 0
    run_id = artifacts.read_run_id(folder / "graph" / "events.parquet")
    events = artifacts.read_parquet(folder / "graph" / "events.parquet")
    layout = artifacts.read_parquet(folder / "slices" / "plan.parquet").to_pylist()
    for k in sorted({row["slice"] for row in layout}):
        ranks = [row["rank"] for row in layout if row["slice"] == k]
        part = events.filter(pc.is_in(events["rank"], value_set=pa.array(ranks, pa.int32())))
        artifacts.write_outputs(folder / "slices" / f"slice={k}", {"events": part},
                                {"events": schemas.SLICE_EVENTS}, run_id=run_id)
    assert from_slices.main(["--job", str(folder)]) == 0
    assert stage.main(["--job", str(folder), "--durations", str(folder / "slices" / "durations.parquet")]) == 0
    assert summary.main(["--job", str(folder)]) == 0
    return folder


CASES = {
    "plan reads the graph": (plan.main, ["--devices", "2"], "graph/events.parquet", "prism graph --job {job}"),
    "calibrate reads the graph": (stage.main, [], "graph/events.parquet", "prism graph --job {job}"),
    "from_slices reads a slice": (from_slices.main, [], "slices/slice=0/events.parquet",
                                  "prism slices run --job {job} --slice 0"),
    "calibrate reads durations": (stage.main, ["--durations", "{job}/slices/durations.parquet"],
                                  "slices/durations.parquet", "prism slices durations --job {job}"),
    "summary reads the calibration": (summary.main, [], "calibrated/iterations.parquet", "prism calibrate --job {job}"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_corrupt_input_is_named_with_its_fix(job, tmp_path, capsys, case):
    main, extra, rel, fix = CASES[case]
    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    target = copy / rel
    for column in range(pq.read_metadata(target).num_columns):  # whichever columns the stage reads
        _corrupt_data_page(target, column)
    before = sorted(p.relative_to(copy) for p in copy.rglob("*") if p != target)
    stamps = {p: p.stat().st_mtime_ns for p in copy.rglob("*.parquet") if p != target}
    capsys.readouterr()
    code = main(["--job", str(copy), *(arg.format(job=copy) for arg in extra)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(target) in err and fix.format(job=copy) in err and "Traceback" not in err
    assert sorted(p.relative_to(copy) for p in copy.rglob("*") if p != target) == before
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*.parquet") if p != target} == stamps
