"""Slice mode: the ranks of each planned slice run the real program together while a replay server answers
for the other ranks from the capture, so they print what the capture printed and issue the same events."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from prism import schemas
from tests.conftest import PROGRAMS, REPO, make_env, run_prism, run_together

pytestmark = pytest.mark.slow

W = 4
PROGRAM = ["-m", "prism.workloads.moe_gpt", "--tp", "2", "--dp", "2", "--ep", "2", "--steps", "2"]
SAME = ("kind", "op", "group_name", "group_seq", "peer", "tag", "bytes")


def _module(module: str, args: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          env=make_env(), timeout=timeout)


def _steps(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if re.fullmatch(r"step=\d+ loss=\S+", line))


@pytest.fixture(scope="module")
def job(workload_captures):
    """A W=4 job captured on two device slots (the capture test_emulate_mode emulates: one per session,
    tests/integration/conftest.py), its graph and a plan of slices of two ranks."""
    job, cap = workload_captures(W, PROGRAM)
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr
    plan = _module("prism.slices.plan", ["--job", str(job), "--devices", "2"])
    assert plan.returncode == 0, plan.stderr
    slices = sorted(set(pq.read_table(job / "slices" / "plan.parquet")["slice"].to_pylist()))
    assert len(slices) == 2
    runs = dict(zip(slices, run_together(*(lambda k=k: _module("prism.slices.run", ["--job", str(job), "--slice",
                                                                                   str(k)]) for k in slices))))
    return job, cap, runs


def test_slices_print_what_the_capture_printed(job):
    _, cap, runs = job
    for k, proc in runs.items():
        assert proc.returncode == 0, f"slice {k}: {proc.stderr}"
    want = _steps(cap.stdout)
    assert len(want) == 4  # two steps, printed by the two tp-0 ranks
    assert sorted(line for proc in runs.values() for line in _steps(proc.stdout)) == want


def test_slice_events_repeat_the_capture_graph(job):
    path, _, runs = job
    graph = pq.read_table(path / "graph" / "events.parquet").to_pylist()
    plan = pq.read_table(path / "slices" / "plan.parquet").to_pylist()
    for k in runs:
        out = path / "slices" / f"slice={k}" / "events.parquet"
        meta = pq.read_schema(out).metadata
        assert meta[b"schema_version"] == schemas.SCHEMA_VERSION.encode()
        rows = pq.read_table(out).to_pylist()
        ranks = sorted(p["rank"] for p in plan if p["slice"] == k)
        assert sorted({r["rank"] for r in rows}) == ranks
        for rank in ranks:
            got = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["seq"])
            want = sorted((g for g in graph if g["rank"] == rank), key=lambda g: g["seq"])
            assert [tuple(r[c] for c in SAME) for r in got] == [tuple(g[c] for c in SAME) for g in want]
            assert [r["event_id"] for r in got] == [g["event_id"] for g in want]
            assert all(r["t_end_ns"] >= r["t_start_ns"] and r["cpu_ns"] >= 0 for r in got)
            assert sum(r["kind"] == "compute" for r in got) > 0


def test_bad_slice_number_and_missing_plan_exit_2_and_write_nothing(job, tmp_path):
    path, _, _ = job
    proc = _module("prism.slices.run", ["--job", str(path), "--slice", "7"])
    assert proc.returncode == 2
    assert "slice 7 is not in the plan" in proc.stderr
    assert not (path / "slices" / "slice=7").exists()
    proc = _module("prism.slices.run", ["--job", str(tmp_path), "--slice", "0"])
    assert proc.returncode == 2 and "plan.parquet" in proc.stderr
    assert not (tmp_path / "slices" / "slice=0").exists()


def test_a_slice_of_another_program_is_named_and_writes_nothing(job, tmp_path):
    path, _, _ = job
    other = {"job": "other", "nproc": W, "workload": {"module": "prism.workloads.moe_gpt",
                                                      "args": PROGRAM[2:-1] + ["3"]}}  # --steps 3
    work = tmp_path / "job"
    (work / "slices").mkdir(parents=True)
    for name in ("capture", "graph"):
        (work / name).symlink_to(path / name)
    (work / "slices" / "plan.parquet").write_bytes((path / "slices" / "plan.parquet").read_bytes())
    proc = _module("prism.slices.run", ["--job", str(work), "--slice", "0", "--config-json", json.dumps(other)])
    assert proc.returncode != 0
    assert re.search(r"rank \d+ diverged from its capture", proc.stderr), proc.stderr[-2000:]
    assert not (work / "slices" / "slice=0").exists()
    assert not list((work / "slices").glob(".slice=*"))


def test_w8_tp_pp_dp_ep_last_stage_slice_prints_the_capture_losses(tmp_path):
    """W=8 (TP2 x PP2 x DP2, EP2): the slice of the loss-printing last-stage ranks gets its activations from
    the replayed first stage (p2p), its DP and EP peers from the replay server, and prints the same losses."""
    job = tmp_path / "job"
    program = ["-m", "prism.workloads.moe_gpt", "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--steps", "2"]
    cap = run_prism(["launch", "--nproc", "8", "--mode", "capture", "--devices", "2", "--out", str(job / "capture"),
                     *program])
    assert cap.returncode == 0, cap.stderr
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr
    assert _module("prism.slices.plan", ["--job", str(job), "--devices", "2"]).returncode == 0
    plan = pq.read_table(job / "slices" / "plan.parquet").to_pylist()
    k = next(p["slice"] for p in plan if p["rank"] == 4)  # tp 0 of the last stage prints the loss
    ranks = sorted(p["rank"] for p in plan if p["slice"] == k)
    proc = _module("prism.slices.run", ["--job", str(job), "--slice", str(k)])
    assert proc.returncode == 0, proc.stderr
    printers = 2 if 6 in ranks else 1  # ranks 4 and 6 print in the capture
    want = _steps(cap.stdout)
    assert len(want) == 4 and _steps(proc.stdout) == (want if printers == 2 else sorted(set(want)))
    rows = pq.read_table(job / "slices" / f"slice={k}" / "events.parquet").to_pylist()
    assert sorted({r["rank"] for r in rows}) == ranks
    assert {"send", "recv", "collective"} <= {r["kind"] for r in rows}


def _results(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("result "))


def test_order_dependent_reductions_repeat_the_capture_bitwise(tmp_path, reduction_order_capture):
    """Groups of 4: gloo's reduction order gives other last bits than the capture's fold (checked here with
    a real run), yet each slice rank gets the capture's values, and the program's data-dependent all_gather
    (sized by those bits, like MoE routing) follows the capture instead of diverging."""
    job = tmp_path / "job"
    program = [str(PROGRAMS / "reduction_order.py")]
    shared, cap = reduction_order_capture  # captured at W=4 on one device slot; a copy of it: this job's
    shutil.copytree(shared / "capture", job / "capture")

    def slices():
        graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out",
                           str(job / "graph")])
        assert graph.returncode == 0, graph.stderr
        assert _module("prism.slices.plan", ["--job", str(job), "--devices", "2"]).returncode == 0
        return run_together(*(lambda k=k: _module("prism.slices.run", ["--job", str(job), "--slice", str(k)])
                              for k in (0, 1)))

    real, runs = run_together(lambda: run_prism(["launch", "--nproc", "4", "--mode", "real", *program]), slices)
    assert real.returncode == 0, real.stderr
    want = _results(cap.stdout)
    assert len(want) == 21
    assert {line.split()[1] for line in set(want) - set(_results(real.stdout))} >= {
        "all_reduce", "all_reduce.future", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
    got = []
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        got += _results(proc.stdout)
    assert sorted(got) == want
