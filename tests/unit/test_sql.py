"""`prism sql`: one DuckDB view per artifact, aligned and CSV output, errors, and the saved catalog."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import graph, sql
from rawgen import megatron_job


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("job")
    megatron_job(tp=2, dp=2, iterations=2).write(folder)
    assert graph.main(["--job", str(folder)]) == 0
    for k in (0, 1):  # a Hive-partitioned stage output
        part = folder / "slices" / f"slice={k}"
        part.mkdir(parents=True)
        pq.write_table(pa.table({"rank": [2 * k, 2 * k + 1], "dur": [1.5, 2.5]}), part / "events.parquet")
    (folder / "emulation").mkdir()  # a second stage writing `events`
    pq.write_table(pa.table({"rank": [0], "loss": [3.25]}), folder / "emulation" / "events.parquet")
    (folder / "graph" / ".events.parquet.tmp-1").write_bytes(b"partial")  # ignored
    return folder


def query(capsys, *argv: str) -> tuple[int, str, str]:
    code = sql.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_one_view_per_artifact(job):
    names = {view.name for view in sql.discover(job)}
    assert names == {"events", "comms", "groups", "ranks", "emulation_events", "slices_events"}  # no duplicate
    by_name = {view.name: view for view in sql.discover(job)}
    assert by_name["events"].path == job / "graph" / "events.parquet"
    assert by_name["slices_events"].hive


def test_aligned_table(job, capsys):
    code, out, _ = query(capsys, "--job", str(job), "SELECT rank, tp, dp, node FROM ranks ORDER BY rank")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "tp", "dp", "node"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["0", "0", "0", "testhost"]
    assert lines[-1] == "(4 rows)"
    assert len({len(line) for line in lines[2:-1]}) == 1  # aligned


def test_csv(job, capsys):
    code, out, _ = query(
        capsys, "--job", str(job), "--csv", "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind"
    )
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["kind", "n"]
    expected = duckdb.sql(
        f"SELECT kind::VARCHAR, count(*) FROM '{job}/graph/events.parquet' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(k, int(n)) for k, n in rows[1:]] == expected


def test_hive_partitions_and_clashes(job, capsys):
    code, out, _ = query(
        capsys, "--job", str(job), "--csv",
        "SELECT slice, count(*) AS n FROM slices_events GROUP BY slice ORDER BY slice",
    )
    assert code == 0 and out.splitlines() == ["slice,n", "0,2", "1,2"]
    code, out, _ = query(capsys, "--job", str(job), "--csv", "SELECT loss FROM emulation_events")
    assert out.splitlines() == ["loss", "3.25"]
    code, _, err = query(capsys, "--job", str(job), "SELECT count(*) FROM graph_events")
    assert code == 2  # one view per artifact: graph/events.parquet is `events` (and capture.events), only


def test_job_from_environment(job, capsys, monkeypatch):
    monkeypatch.setenv("PRISM_JOB", str(job))
    code, out, _ = query(capsys, "--csv", "SELECT count(*) AS n FROM ranks")
    assert code == 0 and out.splitlines() == ["n", "4"]


def test_missing_job(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PRISM_JOB", raising=False)
    monkeypatch.chdir(tmp_path)
    code, _, err = query(capsys, "SELECT 1")
    assert code == 2 and "results/default" in err and "make demo" in err


def test_no_artifacts(tmp_path, capsys):
    code, _, err = query(capsys, "--job", str(tmp_path), "SELECT 1")
    assert code == 2 and str(tmp_path) in err and "prism launch" in err and "prism run" not in err


def test_sql_error(job, capsys):
    code, out, err = query(capsys, "--job", str(job), "SELECT nope FROM events")
    assert code == 2 and out == "" and "nope" in err


def test_catalog_of_a_copied_job_folder_reads_the_copy(job, tmp_path, monkeypatch):
    import shutil

    path = sql.write_catalog(job)
    assert path == job / "prism.duckdb"
    assert not [p for p in job.iterdir() if p.name.startswith(".prism")]
    copy = tmp_path / "moved"
    shutil.copytree(job, copy)
    pq.write_table(pq.read_table(copy / "graph" / "ranks.parquet").slice(0, 1), copy / "graph" / "ranks.parquet")
    monkeypatch.chdir(copy)  # the views name files relative to the job folder
    con = duckdb.connect("prism.duckdb", read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM ranks").fetchone()[0] == 1  # the copy's file, not the original's
    finally:
        con.close()
    monkeypatch.chdir(tmp_path)  # from elsewhere: DuckDB's file_search_path names the folder
    con = duckdb.connect(str(path), read_only=True)
    try:
        con.execute(f"SET file_search_path = '{job}'")
        views = {row[0] for row in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        assert {"events", "comms", "groups", "ranks", "slices_events"} <= views
        n = con.execute("SELECT count(*) FROM events").fetchone()[0]
        assert n == pq.read_metadata(job / "graph" / "events.parquet").num_rows
        assert con.execute("SELECT count(DISTINCT slice) FROM slices_events").fetchone()[0] == 2
    finally:
        con.close()


def test_write_catalog_flag(job, capsys):
    (job / "prism.duckdb").unlink(missing_ok=True)
    code, _, err = query(capsys, "--job", str(job), "--write-catalog")
    assert code == 0 and (job / "prism.duckdb").is_file() and "prism.duckdb" in err


# ------------------------------------------------------------------------- a query command, nothing more


@pytest.mark.parametrize("statement", [
    "COPY (SELECT 1 AS a) TO '{job}/graph/comms.parquet' (FORMAT parquet)",
    "COPY comms TO '{job}/graph/comms.parquet'",
    "ATTACH '{job}/other.duckdb' AS other",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CREATE TABLE t AS SELECT 1",
    "SET enable_external_access = true",
    "SELECT 1; COPY comms TO '{job}/x.csv'",
    "EXPLAIN ANALYZE COPY comms TO '{job}/x.csv'",
])
def test_writing_statements_are_refused(job, capsys, statement):
    before = (job / "graph" / "comms.parquet").read_bytes()
    names = sorted(p.name for p in job.iterdir())
    code, out, err = query(capsys, "--job", str(job), statement.format(job=job))
    assert code == 2 and out == ""
    assert "refused" in err and "read-only queries only" in err
    assert (job / "graph" / "comms.parquet").read_bytes() == before
    assert sorted(p.name for p in job.iterdir()) == names


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{job}/../../../../etc/passwd')",
    "SELECT * FROM glob('/*')",
])
def test_files_outside_the_job_folder_are_refused(job, capsys, statement):
    code, out, err = query(capsys, "--job", str(job), statement.format(job=job))
    assert code == 2 and out == "" and "root:" not in err
    assert "Permission" in err and f"reads only files under {job}" in err


def test_read_only_queries_run(job, capsys):
    for statement in ("DESCRIBE ranks", "SHOW TABLES", "SUMMARIZE ranks", "FROM ranks", "VALUES (1)",
                      "WITH r AS (SELECT * FROM ranks) SELECT count(*) FROM r"):
        code, out, err = query(capsys, "--job", str(job), statement)
        assert code == 0 and out, (statement, err)


def test_schemas_side_by_side(job, capsys):
    by_name = {view.qualified: view for view in sql.discover_schemas(job)}
    assert set(by_name) == {"capture.events", "capture.comms", "capture.groups", "capture.ranks",
                            "slices.events", "emulation.events"}
    assert by_name["slices.events"].hive and by_name["capture.events"].path == job / "graph" / "events.parquet"
    code, out, _ = query(capsys, "--job", str(job), "--csv",
                         "SELECT (SELECT count(*) FROM capture.events) = (SELECT count(*) FROM events) AS same, "
                         "(SELECT count(*) FROM slices.events) AS slice_rows, "
                         "(SELECT loss FROM emulation.events) AS loss")
    assert code == 0 and out.splitlines() == ["same,slice_rows,loss", "True,4,3.25"]


def _copy_job(job, tmp_path):
    import shutil

    dst = tmp_path / "job"
    shutil.copytree(job, dst, ignore=shutil.ignore_patterns("prism.duckdb"))
    return dst


def test_an_unreadable_artifact_does_not_block_the_others(job, tmp_path, capsys):
    bad = _copy_job(job, tmp_path)
    path = bad / "graph" / "comms.parquet"
    path.write_bytes(path.read_bytes()[:-40])  # the footer is gone
    code, out, err = query(capsys, "--job", str(bad), "--csv", "SELECT count(*) AS n FROM ranks")
    assert code == 0 and out.splitlines() == ["n", "4"]
    assert "left out views comms, capture.comms" in err and str(path) in err and f"prism graph --job {bad}" in err
    code, _, err = query(capsys, "--job", str(bad), "SELECT count(*) FROM comms")
    assert code == 2 and "comms was left out" in err and str(path) in err
    assert sql.write_catalog(bad).is_file()


def test_a_corrupt_data_page_is_named(job, tmp_path, capsys):
    from test_artifacts import _corrupt_data_page

    bad = _copy_job(job, tmp_path)
    path = bad / "graph" / "events.parquet"
    _corrupt_data_page(path, column=pq.read_schema(path).names.index("t_start_ns"))
    code, out, err = query(capsys, "--job", str(bad), "SELECT sum(t_start_ns) FROM events")
    assert code == 2 and out == ""
    assert str(path) in err and f"re-run the stage that writes it: prism graph --job {bad}" in err
    code, out, _ = query(capsys, "--job", str(bad), "--csv", "SELECT count(*) AS n FROM ranks")
    assert code == 0 and out.splitlines() == ["n", "4"]


def test_readme_join_of_predicted_and_baseline_iteration_time(tmp_path, capsys):
    """The README's join runs on a job holding a capture graph, its calibration and a baseline graph."""
    import re

    from prism.calibrate import stage

    folder = tmp_path / "tiny"
    megatron_job(tp=2, dp=2, iterations=3).write(folder)
    assert graph.main(["--job", str(folder)]) == 0
    assert stage.main(["--job", str(folder)]) == 0
    megatron_job(tp=2, dp=2, iterations=3).write(folder / "baseline")
    assert graph.main(["--job", str(folder / "baseline")]) == 0
    capsys.readouterr()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    text = re.search(r'prism sql --job results/tiny "\n(.*?)"\n```', readme, re.S).group(1)
    code, out, err = query(capsys, "--job", str(folder), "--csv", text)
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["iteration", "predicted_ms", "measured_ms"] and len(rows) == 4
    assert rows[1][1:] == ["", ""] and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows[2:])


def test_artifacts_of_two_runs_are_reported(job, tmp_path, capsys):
    from prism import artifacts, schemas

    mixed = _copy_job(job, tmp_path)
    path = mixed / "graph" / "ranks.parquet"
    artifacts.write_parquet(pq.read_table(path), path, schemas.RANKS, run_id="another")
    code, out, err = query(capsys, "--job", str(mixed), "--csv", "SELECT count(*) AS n FROM ranks")
    assert code == 0 and out.splitlines() == ["n", "4"]
    assert "answers may mix runs" in err and "another" in err and str(path) in err
    code, _, err = query(capsys, "--job", str(job), "SELECT count(*) FROM ranks")
    assert code == 0 and "mix runs" not in err


@pytest.mark.parametrize("text", ["", "   ", "-- c", "/* only a comment */"])
def test_a_query_without_a_statement_is_one_line(job, capsys, text):
    """Issue 23: `prism sql ""` and `prism sql "-- c"` ended in an AttributeError."""
    code, out, err = query(capsys, "--job", str(job), text)
    assert code == 2 and not out and "holds no statement" in err and "SELECT * FROM ranks" in err
    assert len(err.strip().splitlines()) == 1


def test_ctrl_c_stops_a_long_query_at_once(job):
    """Issue 23: a long query ignored SIGINT for 15-30 s, then exited 1 with a traceback."""
    import signal
    import subprocess
    import sys
    import time

    long_query = "SELECT sum(hash(a.range * b.range)) FROM range(100000000) a, range(100000000) b"
    proc = subprocess.Popen([sys.executable, "-m", "prism.sql", "--job", str(job), long_query],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as on a terminal
    time.sleep(4)  # started: imports, views, the query running
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    took = time.monotonic() - sent
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert took < 3, took
