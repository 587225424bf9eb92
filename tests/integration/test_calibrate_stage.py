"""The calibrate stage on a real captured graph (W=2, DP2 x EP2, 2 steps): outputs, and clear errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism import schemas
from prism.artifacts import read_run_id, write_parquet
from prism.calibrate import reference, stage
from prism.calibrate.durations import bare_graph
from prism.calibrate.sweep import discover
from tests.conftest import REPO, make_env, run_prism

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graph_job(tmp_path_factory) -> Path:
    job = tmp_path_factory.mktemp("calibrate") / "job"
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(job),
                      "-m", "prism.workloads.moe_gpt", "--dp", "2", "--ep", "2", "--steps", "2"])
    assert proc.returncode == 0, proc.stderr
    proc = run_prism(["graph", "--job", str(job)])
    assert proc.returncode == 0, proc.stderr
    return job


def calibrate(job: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism.calibrate", "--job", str(job), *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=make_env())


def copy_graph(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "graph", dst / "graph")
    return dst


def test_stage_writes_a_consistent_timeline(graph_job):
    proc = calibrate(graph_job)
    assert proc.returncode == 0, proc.stderr
    assert "iteration time" in proc.stdout
    out = graph_job / "calibrated"
    for name in ("timeline", "iterations"):
        meta = pq.read_schema(out / f"{name}.parquet").metadata
        assert meta[b"schema_version"] == schemas.SCHEMA_VERSION.encode()
        assert pq.read_schema(out / f"{name}.parquet").remove_metadata().equals(schemas.ALL[name])

    events = pq.read_table(graph_job / "graph" / "events.parquet").to_pandas()
    timeline = pq.read_table(out / "timeline.parquet").to_pandas()
    assert len(timeline) == len(events)
    t = timeline.merge(events[["event_id", "rank", "seq", "kind", "comm_id", "op_event_id"]],
                       on=["event_id", "rank", "seq"], validate="one_to_one")
    assert (t.start_ns >= 0).all() and (t.start_ns <= t.end_ns).all()
    for _, rank in t.sort_values(["rank", "seq"]).groupby("rank"):  # program order on one clock
        assert rank.start_ns.iloc[0] == 0
        assert np.array_equal(rank.start_ns.to_numpy()[1:], rank.end_ns.to_numpy()[:-1])

    # a collective's waits all end at or after its last member's issue
    ops = t[t.kind == "collective"]
    last_issue = ops.groupby("comm_id").start_ns.max()
    waits = t[t.kind == "wait"].merge(ops[["event_id", "comm_id"]].rename(columns={"event_id": "op_event_id"}),
                                      on="op_event_id", suffixes=("_w", ""))
    assert len(waits) > 0
    assert (waits.end_ns.to_numpy() >= last_issue.loc[waits.comm_id].to_numpy()).all()

    iters = pq.read_table(out / "iterations.parquet").to_pandas()
    assert sorted(iters["rank"].unique()) == [0, 1]
    for _, rank in iters.groupby("rank"):
        assert rank.iteration.tolist() == [0, 1]  # 2 steps, one iteration_end marker each
        assert (rank.duration_ns > 0).all() and (rank.duration_ns == rank.end_ns - rank.start_ns).all()
        assert rank.start_ns.iloc[0] == 0 and rank.start_ns.iloc[1] == rank.end_ns.iloc[0]
    ends = t[(events.set_index("event_id").loc[t.event_id, "op"].to_numpy() == "iteration_end")]
    assert sorted(ends.end_ns.tolist()) == sorted(iters.end_ns.tolist())


def test_real_graph_numba_equals_reference(graph_job):
    job = stage.load_graph(graph_job)
    g, c = job.graph, job.columns
    durations, transfer = bare_graph(g.kind, g.comm, g.wait_op, c["device_ns"], c["t_start_ns"], c["t_end_ns"],
                                     c["t_complete_ns"], g.n_comms)
    assert (durations >= 0).all() and (transfer >= 0).all() and transfer.max() > 0
    want = reference.sweep(g, durations, transfer)
    sched, got = discover(g, durations, transfer)
    for timeline in (got, sched.replay(durations, transfer)):
        for name in ("start_ns", "end_ns", "comm_start_ns", "comm_end_ns"):
            assert np.array_equal(getattr(timeline, name), getattr(want, name)), name


def test_explicit_durations_are_used(graph_job, tmp_path):
    job = copy_graph(graph_job, tmp_path / "job")
    ids = pq.read_table(job / "graph" / "events.parquet", columns=["event_id"]).column("event_id").to_numpy()
    table = pa.table({"event_id": ids[::-1].copy(), "duration_ns": np.full(len(ids), 1000, dtype=np.int64)})
    pq.write_table(table, tmp_path / "durations.parquet")
    comms = pq.read_table(job / "graph" / "comms.parquet", columns=["comm_id"]).column("comm_id").to_numpy()
    pq.write_table(pa.table({"comm_id": comms, "transfer_ns": np.zeros(len(comms), dtype=np.int64)}),
                   tmp_path / "transfers.parquet")
    assert stage.main(["--job", str(job), "--durations", str(tmp_path / "durations.parquet"),
                       "--transfers", str(tmp_path / "transfers.parquet")]) == 0
    timeline = pq.read_table(job / "calibrated" / "timeline.parquet").to_pandas()
    # every event takes 1 us, comms take no time, and the two ranks run the same program: lockstep
    assert (timeline.end_ns - timeline.start_ns == 1000).all()
    assert timeline.groupby("rank").end_ns.max().nunique() == 1


def expect_error(job: Path, capsys, *args: str) -> str:
    assert stage.main(["--job", str(job), *args]) == 2
    assert not (job / "calibrated").exists()
    err = capsys.readouterr().err
    assert err.startswith("prism calibrate: error: ") and len(err.strip().splitlines()) == 1
    return err


def test_missing_graph(tmp_path, capsys):
    err = expect_error(tmp_path / "nothing", capsys)
    assert "graph/events.parquet: missing" in err and "prism graph" in err


def test_durations_of_another_graph(graph_job, tmp_path, capsys):
    job = copy_graph(graph_job, tmp_path / "job")
    ids = pq.read_table(job / "graph" / "events.parquet", columns=["event_id"]).column("event_id").to_numpy()
    path = tmp_path / "durations.parquet"
    pq.write_table(pa.table({"event_id": ids[:-3], "duration_ns": np.ones(len(ids) - 3, dtype=np.int64)}), path)
    err = expect_error(job, capsys, "--durations", str(path))
    assert str(path) in err and "another graph" in err and f"a graph of {len(ids)} events" in err
    shifted = ids + 1
    pq.write_table(pa.table({"event_id": shifted, "duration_ns": np.ones(len(ids), dtype=np.int64)}), path)
    err = expect_error(job, capsys, "--durations", str(path))
    assert f"event_id {int(shifted[-1])} is not in the graph" in err


def test_unmatched_comm(graph_job, tmp_path, capsys):
    job = copy_graph(graph_job, tmp_path / "job")
    comms = pq.read_table(job / "graph" / "comms.parquet")
    path = job / "graph" / "comms.parquet"
    write_parquet(comms.slice(1), path, schemas.COMMS, run_id=read_run_id(path))
    err = expect_error(job, capsys)
    assert "events.parquet" in err and "unmatched comm" in err and "rank 0 seq" in err and "on group" in err


def test_cycle(graph_job, tmp_path, capsys):
    job = copy_graph(graph_job, tmp_path / "job")
    path = job / "graph" / "events.parquet"
    events = pq.read_table(path)
    comms = pq.read_table(job / "graph" / "comms.parquet")
    df = events.to_pandas()
    # rank 1 takes part in its first two collectives in the opposite order: each rank then waits for an
    # op the other issues only after its own wait
    a, b = df[(df["rank"] == 1) & (df["kind"] == "collective")].event_id.iloc[:2]
    comm = events.column("comm_id").to_numpy().copy()
    comm[[a, b]] = comm[[b, a]]
    events = events.set_column(events.schema.get_field_index("comm_id"), "comm_id", pa.array(comm))
    lists = comms.column("event_ids").to_pylist()
    swap = {a: b, b: a}
    lists = [[swap.get(e, e) for e in ids] for ids in lists]
    comms = comms.set_column(comms.schema.get_field_index("event_ids"), "event_ids",
                             pa.array(lists, pa.list_(pa.int64())))
    run_id = read_run_id(path)
    write_parquet(events, path, schemas.EVENTS, run_id=run_id)
    write_parquet(comms, job / "graph" / "comms.parquet", schemas.COMMS, run_id=run_id)
    err = expect_error(job, capsys)
    assert str(path) in err and "dependency cycle" in err and "rank 0 seq" in err and "rank 1" in err
