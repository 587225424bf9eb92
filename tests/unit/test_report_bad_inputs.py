"""`prism report` and `prism export` over a damaged Parquet input or an unusable --out: one line naming the file
and the fix, exit 2, nothing written (issue 23: polars' ComputeError, IsADirectoryError, NotADirectoryError,
FileNotFoundError tracebacks)."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from prism import graph
from prism.calibrate import from_slices, stage
from prism.report import export
from prism.report import stage as report_stage
from prism.slices import plan
from rawgen import megatron_job
from test_hostile_paths import _slice_events

UNWRITABLE = "/sys/prism-test/report.html"  # not writable, even by root


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report_bad") / "job"
    megatron_job(tp=2, dp=2, iterations=3).write(folder)
    args = ["--job", str(folder)]
    assert graph.main(args) == 0 and plan.main(args + ["--devices", "2"]) == 0
    _slice_events(folder)
    assert from_slices.main(args) == 0
    assert stage.main(args + ["--durations", str(folder / "slices" / "durations.parquet")]) == 0
    return folder


def _damage(path, how: str) -> None:
    size = path.stat().st_size
    path.write_bytes({"truncated": path.read_bytes()[: size // 2], "zero-byte": b"", "zeroed": bytes(size)}[how])


def _one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


COMMANDS = {"report": lambda job, out: report_stage.main(["--job", str(job), *(["--out", str(out)] if out else [])]),
            "export": lambda job, out: export.main(["--job", str(job), "--timeline", "calibrated", "--format",
                                                    "perfetto", *(["--out", str(out)] if out else [])])}


@pytest.mark.parametrize("how", ["truncated", "zero-byte", "zeroed"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_damaged_timeline_is_named_with_its_fix(job, tmp_path, capsys, command, how):
    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    target = copy / "calibrated" / "timeline.parquet"
    _damage(target, how)
    capsys.readouterr()
    assert COMMANDS[command](copy, None) == 2
    err = _one_line(capsys.readouterr().err)
    assert str(target) in err and f"prism calibrate --job {copy}" in err
    assert not (copy / "report").exists() and not (copy / "export").exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unusable_out_is_named_with_its_fix(job, tmp_path, capsys, command):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = {tmp_path: "is a folder", a_file / "out.html": "cannot create", UNWRITABLE: "cannot create"}
    for out, words in cases.items():
        capsys.readouterr()
        assert COMMANDS[command](job, out) == 2, out
        err = _one_line(capsys.readouterr().err)
        assert str(out) in err and words in err, err
        if out == tmp_path:  # the file name to give is one this command writes
            assert str(tmp_path / {"report": "report.html", "export": "calibrated.perfetto.json"}[command]) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_kineto_export_into_a_file_is_refused(job, tmp_path, capsys):
    a_file = tmp_path / "trace"
    a_file.write_text("mine")
    code = export.main(["--job", str(job), "--timeline", "calibrated", "--format", "kineto", "--out", str(a_file)])
    err = _one_line(capsys.readouterr().err)
    assert code == 2 and f"--out {a_file} is a file" in err and a_file.read_text() == "mine"


def _as_other_run(src, dst) -> None:
    """`src` as if written by another run (its run id changed), at `dst`: a folder copied from another job."""
    table = pq.read_table(src)
    meta = dict(table.schema.metadata or {})
    meta[b"prism.run_id"] = b"another-run"
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(meta), dst)


@pytest.mark.parametrize("folder", ["emulation", "calibrated"])
def test_a_folder_copied_from_another_run_is_named_not_shown(job, tmp_path, capsys, folder):
    """Issue 23: an `emulation/` from another run was shown as this job's sandbox section; a `calibrated/`
    from another run was blamed on the capture ("stale, re-capture")."""
    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    name = {"emulation": "events.parquet", "calibrated": "timeline.parquet"}[folder]
    _as_other_run(job / "calibrated" / "timeline.parquet", copy / folder / name)
    capsys.readouterr()
    assert report_stage.main(["--job", str(copy)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"the older one, {copy / folder / name}, is stale" in err, err
    assert "prism emulate" in err if folder == "emulation" else "prism calibrate" in err
    assert not (copy / "report").exists()
