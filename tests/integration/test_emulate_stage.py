"""The emulate stage on a real captured job (W=4: PP2 x DP2, EP2), with a stand-in for the launcher that
writes its OUT folder in the contract's format (`emulate_fake`): outputs, clock, substitution, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from prism import artifacts, schemas
from prism import sql as prism_sql
from prism.job import iterations_table, load_graph
from prism.calibrate.sweep import Timeline
from prism.emulate import outputs, stage
from tests.conftest import REPO, make_env, run_prism
from tests.integration.emulate_fake import T0, fake_launcher, only_kind, restamp

pytestmark = pytest.mark.slow

WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--pp", "2", "--dp", "2", "--ep", "2", "--steps", "2",
            "--microbatches", "2", "--hidden", "32", "--ffn-hidden", "32", "--seq-len", "16", "--vocab", "64",
            "--heads", "2", "--kv-heads", "2"]


@pytest.fixture(scope="module")
def calibrated_job(tmp_path_factory) -> Path:
    job = tmp_path_factory.mktemp("emulate") / "job"
    for args in (["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out", str(job), *WORKLOAD],
                 ["graph", "--job", str(job)], ["calibrate", "--job", str(job)]):
        proc = run_prism(args, timeout=400)
        assert proc.returncode == 0, proc.stderr
    return job


@pytest.fixture
def job(calibrated_job, tmp_path) -> Path:
    """A private copy (tests write emulation/ and break things)."""
    dst = tmp_path / "job"
    shutil.copytree(calibrated_job, dst, ignore=shutil.ignore_patterns("emulation"))
    return dst


def read(job: Path, name: str):
    return pq.read_table(job / "emulation" / f"{name}.parquet").to_pandas()


def test_a_partial_replay_the_sweep_computes_the_rest(job):
    """The worker replays only the cone (a run of each virtual rank's events): every other event of that
    rank comes from the substituted sweep, and the job's events are all there, once."""
    em, _ = stage.emulate(job, "pp=last,tp=0,dp=0", launch=fake_launcher(job, [2], [3], cone=(3, 9)))
    graph = pq.read_table(job / "graph" / "events.parquet").to_pandas().sort_values(["rank", "seq"])
    events = read(job, "events")
    assert events[["rank", "seq"]].to_numpy().tolist() == graph[["rank", "seq"]].to_numpy().tolist()
    mine = events[events["rank"] == 3]
    assert sorted(mine[mine.source == "replay"].seq) == list(range(3, 9))
    assert set(mine[mine.source != "replay"].source) == {"computed"} and len(mine) == int((graph["rank"] == 3).sum())
    # replayed and computed rows of a rank: one sequence on one clock, the tail after the replay included
    assert schemas.timeline_problem(pq.read_table(job / "emulation" / "events.parquet")) is None
    tail = mine[mine.seq >= 9]
    assert tail.start_ns.iloc[0] >= mine[mine.seq == 8].end_ns.iloc[0]


def test_outputs_on_one_clock(job):
    em, text = stage.emulate(job, "pp=last,tp=0,dp=0", launch=fake_launcher(job, [2], [3]))
    assert em.sandbox == [2]
    graph = pq.read_table(job / "graph" / "events.parquet").to_pandas().sort_values(["rank", "seq"])
    events = read(job, "events")
    assert pq.read_schema(job / "emulation" / "events.parquet").remove_metadata().equals(schemas.EMULATION_EVENTS)
    assert len(events) == len(graph)
    assert events[["rank", "seq", "event_id"]].to_numpy().tolist() == graph[["rank", "seq", "event_id"]].to_numpy().tolist()
    assert events.groupby("rank").source.agg(lambda s: sorted(set(s))).to_dict() == {
        0: ["computed"], 1: ["computed"], 2: ["sandbox"], 3: ["replay"]}

    # sandbox and replay rows: their own measurement on the emulation's clock (ns from t0)
    raw = restamp(artifacts.read_raw_stream(job / "raw" / "rank=2" / "events.arrow"), 1.0).to_pandas()
    mine = events[events["rank"] == 2]
    assert (mine.start_ns.to_numpy() == raw.t_start_ns.to_numpy() - T0).all()
    assert (mine.end_ns.to_numpy() == raw.t_end_ns.to_numpy() - T0).all()
    assert (mine.device_ns.to_numpy() == raw.device_ns.to_numpy()).all()
    assert mine.comm_id.tolist() == graph[graph["rank"] == 2].comm_id.tolist()

    # the sandbox measured exactly its captured durations, so the substituted sweep is the calibrated timeline;
    # the computed ranks 0 and 1 follow it exactly until their first comm shared with the live ranks 2 and 3
    # (whose fake rows are their captured spans back to back: earlier or later than calibrated, depending on
    # the capture's timings); from there they are swept from the live rows (`prism.emulate.tail`), which this
    # fake cannot pin down: its live ranks are re-timed each on its own, not by the sweep (see the flows below)
    timeline = pq.read_table(job / "calibrated" / "timeline.parquet").to_pandas().sort_values(["rank", "seq"])
    computed = events[events.source == "computed"]
    want = timeline[timeline["rank"].isin([0, 1])]
    live_comms = set(events[events["rank"].isin([2, 3]) & (events.comm_id >= 0)].comm_id)
    for r in (0, 1):
        got = computed[computed["rank"] == r]
        cal = want[want["rank"] == r]
        shared = got.comm_id.isin(live_comms).to_numpy()
        assert shared.any()
        first = int(np.argmax(shared))
        assert first > 0  # events before it, so the check below is not empty
        assert (got.start_ns.to_numpy()[:first] == cal.start_ns.to_numpy()[:first]).all()
        assert (got.end_ns.to_numpy()[:first] == cal.end_ns.to_numpy()[:first]).all()
    import polars as pl
    from prism.report import export
    flows = export._flows(type("T", (), {"events": pl.from_pandas(events)})())
    # (the fake's two live ranks are re-timed each on its own, so arrows between them may point backwards; a
    # real launch's replay is driven by the sandbox's completions: the tiny job's exports have none)
    source = events.source.to_numpy()
    assert flows and all(source[d] != "computed" for _, src_ns, d, dst_ns in flows if dst_ns < src_ns)

    # iterations: the sweep's for every rank, and the sandbox's measured ones
    iters = read(job, "iterations")
    calibrated = pq.read_table(job / "calibrated" / "iterations.parquet").to_pandas()
    comp = iters[iters.source == "computed"].drop(columns="source").reset_index(drop=True)
    assert comp.to_numpy().tolist() == calibrated.to_numpy().tolist()
    sb = iters[iters.source == "sandbox"]
    ends = raw[(raw.kind == "marker") & (raw.op == "iteration_end")].t_end_ns.to_numpy() - T0
    assert sb["rank"].tolist() == [2, 2] and sb.end_ns.tolist() == ends.tolist()
    assert sb.duration_ns.tolist() == [ends[0] - (raw.t_start_ns.iloc[0] - T0), ends[1] - ends[0]]
    assert em.measured_iterations == [0, 1]

    memory = read(job, "memory")
    markers = raw[raw.kind == "marker"]
    assert memory.seq.tolist() == markers.seq.tolist()
    assert memory.mem_peak_bytes.tolist() == markers.mem_peak_bytes.tolist()
    assert memory.marker.astype(str).tolist() == markers.op.astype(str).tolist()

    assert (job / "emulation" / "logs" / "rank=2.log").read_text() == "rank 2 ran\n"
    assert json.loads((job / "emulation" / "meta.json").read_text())["emulation"]["communicators"] == 3
    summary = (job / "emulation" / "summary.txt").read_text()
    assert summary == text and "calibrated prediction" in summary and "rank 2: measured" in summary
    assert not list(job.glob(".emulation*"))
    views = {v.name for v in prism_sql.discover(job)}
    assert {"emulation_events", "emulation_iterations", "memory", "events", "iterations"} <= views
    con, skipped = prism_sql.connect(job)
    assert skipped == {}
    assert dict(con.execute("SELECT source, count(*) FROM emulation_events GROUP BY 1").fetchall()) == {
        s: int((events.source == s).sum()) for s in ("computed", "replay", "sandbox")}


def test_a_slower_sandbox_delays_the_job(job):
    """Sandbox compute 3x its capture: the computed timeline can only move later, and the job does."""
    em, text = stage.emulate(job, "2", launch=fake_launcher(job, [2], [], scale=3.0))
    timeline = pq.read_table(job / "calibrated" / "timeline.parquet").sort_by([("rank", "ascending"),
                                                                             ("seq", "ascending")])
    assert (em.computed.end_ns >= timeline["end_ns"].to_numpy()).all()
    assert em.computed.end_ns[-1] > timeline["end_ns"].to_numpy()[-1]
    calibrated = artifacts.read_parquet(job / "calibrated" / "iterations.parquet")
    it = em.tables["iterations"]
    computed = it.filter(pc.equal(it["source"].cast(pa.string()), "computed"))
    cal = outputs.job_iteration_ns(calibrated)
    emu = outputs.job_iteration_ns(computed)
    assert emu[1] > cal[1]
    # a rank ends no earlier than the sum of its own durations: rank 2's calibrated ones + its extra compute
    from prism.calibrate.substitute import calibrated_inputs

    job_graph = load_graph(job)
    durations = calibrated_inputs(job, job_graph)[0]
    lo, hi = job_graph.graph.rank_ptr[2], job_graph.graph.rank_ptr[3]
    raw = artifacts.read_raw_stream(job / "raw" / "rank=2" / "events.arrow")
    extra = sum(int(3 * d) - d for d in only_kind(raw, "compute")["device_ns"].to_pylist())
    assert int(em.computed.end_ns[hi - 1]) >= int(durations[lo:hi].sum()) + extra


def run_main(args, capsys):
    code = stage.main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("spec, words", [("9", "rank 9 is out of range: the job has 4 ranks (0..3)"),
                                         ("pp=5", "the job has no pp=5; its pp values are [0, 1]"),
                                         ("tp=1", "no tp=1; its tp values are [0]")])
def test_bad_sandbox(job, capsys, spec, words):
    code, err = run_main(["--job", job, "--sandbox", spec], capsys)
    assert code == 2 and words in err and err.count("\n") == 1
    assert not (job / "emulation").exists() and not list(job.glob(".emulation*"))


def test_job_without_calibration(job, capsys):
    shutil.rmtree(job / "calibrated")
    code, err = run_main(["--job", job], capsys)
    assert code == 2 and "not calibrated: run `prism calibrate --job" in err


def test_calibration_of_another_graph(job, capsys):
    path = job / "calibrated" / "timeline.parquet"
    table = pq.read_table(path)
    artifacts.write_parquet(table.slice(0, table.num_rows - 5), path, schemas.TIMELINE,
                            run_id=artifacts.read_run_id(path))
    code, err = run_main(["--job", job], capsys)
    assert code == 2 and "calibration is of another graph" in err


def test_artifacts_of_another_run(job, capsys):
    path = job / "calibrated" / "timeline.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"prism.run_id": b"someone-else"}), path)
    code, err = run_main(["--job", job], capsys)
    assert code == 2 and "(run someone-else)" in err and "come from different runs" in err


def test_graph_of_another_capture(job, capsys):
    meta = json.loads((job / "raw" / "meta.json").read_text())
    meta["world_size"] = 8
    (job / "raw" / "meta.json").write_text(json.dumps(meta))
    code, err = run_main(["--job", job], capsys)
    assert code == 2 and "ranks.parquet: 4 ranks, but the capture" in err and "has 8" in err


def test_existing_emulation_needs_force(job, capsys):
    (job / "emulation").mkdir()
    (job / "emulation" / "keep.txt").write_text("mine")
    code, err = run_main(["--job", job], capsys)
    assert code == 2 and "pass --force" in err
    assert (job / "emulation" / "keep.txt").read_text() == "mine"
    stage.emulate(job, None, force=True, launch=fake_launcher(job, [2], []))
    assert not (job / "emulation" / "keep.txt").exists() and (job / "emulation" / "events.parquet").is_file()


def test_sandbox_departing_from_its_capture(job):
    def edit(rank, table):
        kinds = table["kind"].cast(pa.string()).to_pylist()
        i = kinds.index("collective", 20)
        nbytes = table["bytes"].to_numpy().copy()
        nbytes[i] += 4
        return table.set_column(table.schema.get_field_index("bytes"), "bytes", pa.array(nbytes, pa.int64()))

    with pytest.raises(outputs.MismatchError, match=r"sandbox rank 2 departed from its capture at seq \d+"):
        stage.emulate(job, "2", launch=fake_launcher(job, [2], [], edit=edit))
    assert not (job / "emulation").exists() and not list(job.glob(".emulation*"))


def test_failed_launch_writes_nothing(job):
    with pytest.raises(stage.LaunchFailed, match="exit code 3"):
        stage.emulate(job, "2", launch=fake_launcher(job, [2], [], fail=3))
    assert not (job / "emulation").exists() and not list(job.glob(".emulation*"))


def test_launch_command_follows_the_contract(job):
    from prism.emulate import inputs

    j = inputs.load(job)
    cmd = stage.launch_command(j, [2, 3], job / "out", devices=2, steps=1, pruning=False, prefetch_mb=64, pin=True,
                               what_if=["--extra-compute-ms", "20"])
    i = cmd.index("launch")
    assert cmd[i:i + 17] == ["launch", "--nproc", "4", "--mode", "emulate", "--capture", str(job), "--sandbox",
                             "2,3", "--out", str(job / "out"), "--devices", "2", "--no-pruning", "--prefetch-mb",
                             "64", "--steps-limit"]
    assert cmd[-len(WORKLOAD) - 2:] == WORKLOAD + ["--extra-compute-ms", "20"]  # the capture's program, what-if


def test_steps_limit_measures_a_prefix(job):
    def first_iteration(rank, table):
        return table.filter(pc.equal(table["iteration"], 0))

    with pytest.raises(outputs.MismatchError, match="the sequence ended"):
        stage.emulate(job, "2", launch=fake_launcher(job, [2], [], edit=first_iteration))
    em, text = stage.emulate(job, "2", steps=1, launch=fake_launcher(job, [2], [], edit=first_iteration))
    assert em.measured_iterations == [0] and "1 iteration(s) emulated (0)" in text
    events = read(job, "events")
    mine = events[events["rank"] == 2]
    assert set(mine[mine.iteration == 0].source) == {"sandbox"} and set(mine[mine.iteration == 1].source) == {
        "computed"}


def test_real_emulation_end_to_end(job):
    """`prism emulate` over `prism launch --mode emulate`: the sandbox's real run, its log, its memory."""
    proc = run_prism(["emulate", "--job", str(job), "--sandbox", "pp=last,dp=1", "--devices", "1"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sandbox rank(s) 3 of W=4" in proc.stdout
    events = read(job, "events")
    graph = pq.read_table(job / "graph" / "events.parquet").to_pandas()
    assert len(events) == len(graph)
    mine = events[events["rank"] == 3]
    assert set(mine.source) == {"sandbox"} and len(mine) == int((graph["rank"] == 3).sum())
    assert (mine.end_ns.to_numpy()[1:] >= mine.start_ns.to_numpy()[1:]).all()
    iters = read(job, "iterations")
    assert sorted(iters[iters.source == "sandbox"].iteration) == [0, 1]
    assert len(read(job, "memory")) == int(((graph["rank"] == 3) & (graph.kind == "marker")).sum())
    logs = job / "emulation" / "logs"
    log = logs / "rank=3.log" if (logs / "rank=3.log").is_file() else logs / "launch.log"  # per-rank: the runtime's
    assert "step=2 loss=" in log.read_text() and "step=2 loss=" in proc.stdout
    meta = json.loads((job / "emulation" / "meta.json").read_text())
    assert meta["mode"] == "emulate" and meta["sandbox"] == [3] and meta["emulation"]["communicators"] > 0
    # the transfer hold: some of the sandbox's collectives ended at its arrival + the calibrated transfer
    assert meta["emulation"]["transfer_holds"] > 0 and meta["emulation"]["transfer_hold_s"] > 0, meta["emulation"]
    diag = meta["emulation"]["rank_diagnostics"]["3"]  # the sandbox rank's (emulated_works.HOPS, thread_cpu)
    assert diag["protocol_ops"] > 0 and diag["exchange_s"] > 0 and diag["by_op"], diag
    assert diag["threads_cpu_s"]["MainThread"] > 0 and "prism-emu-g" in diag["threads_cpu_s"], diag
    _check_delays(job, proc.stdout, meta, sandbox=3)


def _check_delays(job: Path, stdout: str, meta: dict, sandbox: int) -> None:
    """The emulation's own delay per op kind (prism/emulate/delays.py): a row per op kind of the sandbox's real
    exchanges (its comms with replayed ranks in the graph), each kind's n their count and the replay worker's
    (meta.json); the summary, `prism sql`'s emulation.delays and the report show the table's numbers."""
    import html
    import re

    from prism.emulate import delays
    from prism.report.html import build

    comms = pq.read_table(job / "graph" / "comms.parquet").to_pylist()
    want: dict[str, int] = {}
    for c in comms:
        if sandbox in c["members"] and len(set(c["members"])) > 1:
            op = "send/recv" if c["kind"] == "p2p" else c["op"]
            want[op] = want.get(op, 0) + 1
    table = delays.read_delays(job)
    got = dict(zip(table["op"].to_pylist(), table["n"].to_pylist()))
    assert got == want and len(want) >= 2, (got, want)
    assert got == {op: d["n"] for op, d in meta["emulation"]["cone"]["exchange_late_by_op"].items()}
    assert table["iterations"][0].as_py() == [0, 1]
    rows = table.to_pylist()
    shown = ("late_median_ms", "late_p95_ms", "late_max_ms", "late_ms_per_iteration")
    summary = (job / "emulation" / "summary.txt").read_text()
    lines = delays.text_lines(table)
    assert "\n".join(lines) in summary and "\n".join(lines) in stdout
    assert summary.index("emulation delay") < summary.index(lines[0])  # under the sandbox ranks' lines
    for row, line in zip(rows, lines[2:]):
        assert line.split() == [row["op"], str(row["n"])] + [f"{row[k]:.2f}" for k in shown]
    _, got_sql, _ = prism_sql.run_query(job, f"SELECT op, n, {', '.join(shown)} FROM emulation.delays ORDER BY op")
    assert got_sql == [tuple(r[k] for k in ("op", "n", *shown)) for r in rows]
    page = build(job)
    section = page[page.index("Emulation: its own delay per op kind"):]
    assert html.escape("\n".join(lines)) in section
    for row in rows:
        cells = re.search(rf"<tr><td>{re.escape(row['op'])}</td>(.*?)</tr>", section).group(1)
        values = re.findall(r"<td class='n'>(-?[\d.]+)</td>", cells)
        assert values[:5] == [str(row["n"])] + [f"{row[k]:.2f}" for k in ("late_median_ms", "late_p95_ms",
                                                                           "late_max_ms", "late_mean_ms")]
        assert values[5] == f"{row['late_ms_per_iteration']:.2f}"


def test_summary_report_and_bench_show_the_same_figures(job):
    """One set of figures (prism/emulate/results.py): the numbers the emulation's summary prints are those the
    report's emulation section, `prism sql`'s emulation.figures and the fidelity bench show; the sandbox's time
    is its program's (what the job under the sandbox carries) plus the emulation's own delay."""
    import re

    from prism.bench.fidelity import emulated_sandbox
    from prism.emulate import results
    from prism.report.html import build

    em, text = stage.emulate(job, "pp=last,tp=0,dp=0", launch=fake_launcher(job, [2], [3], scale=3.0))
    fig = results.read_figures(job)

    def number(pattern: str, source: str) -> float:
        return float(re.search(pattern, source).group(1))

    assert number(r"calibrated prediction: +([\d.]+) ms", text) == round(fig.predicted_ms, 2)
    under = number(r"under the sandbox's measured behaviour: +([\d.]+) ms", text)
    measured = number(r"rank 2: measured ([\d.]+) ms", text)
    program = number(r"program ([\d.]+) ms", text)
    delay = number(r"emulation delay (-?[\d.]+) ms", text)
    assert abs(measured - (program + delay)) <= 0.011
    # a 3x slower sandbox compute is the program's: the job under the sandbox is slower than predicted
    assert program > number(r"calibrated prediction ([\d.]+) ms$", text.splitlines()[6]) and under > fig.predicted_ms

    page = build(job)
    section = page[page.index("Emulation: sandbox ranks"):]
    # the summary's lines, verbatim, and the rank's row of the table with the same numbers
    for line in results.text_lines(fig):
        assert line.replace("'", "&#x27;") in section
    row = re.search(r"<tr><td class='n'>2</td>(.*?)</tr>", section).group(1)
    cells = [float(c) for c in re.findall(r"<td class='n'>(-?[\d.]+)</td>", row)]
    assert cells[0] == measured and cells[3] == program and cells[4] == delay

    _, got, _ = prism_sql.run_query(job, "SELECT rank, predicted_ms, under_sandbox_ms, measured_ms, delay_ms "
                                         "FROM emulation.figures ORDER BY rank")
    assert [tuple(None if v is None else round(v, 2) for v in row[1:]) for row in got] == [
        (round(fig.predicted_ms, 2), under, None, None), (round(fig.ranks[0].predicted_ms, 2), program, measured, delay)]

    bench = emulated_sandbox(job, pq.read_table(job / "calibrated" / "timeline.parquet"), None)
    assert "error" not in bench, bench
    assert (round(bench["sandbox_ms"], 2), round(bench["job_ms"], 2), round(bench["computed_rank_ms"], 2)) == (
        measured, under, program)

    # a launch that recorded no real exchange: the delays table is there, empty, and the summary and report say so
    empty = pq.read_table(job / "emulation" / "delays.parquet")
    assert empty.num_rows == 0 and empty.schema.remove_metadata().equals(schemas.EMULATION_DELAYS)
    assert "emulation's own delay per op kind" in text and "no real exchanges" in text
    assert "no real exchanges" in page[page.index("Emulation: its own delay per op kind"):]
    assert prism_sql.run_query(job, "SELECT count(*) FROM emulation.delays")[1] == [(0,)]


def test_a_second_emulation_of_the_job_is_refused_while_the_first_runs(job, capsys, monkeypatch):
    """Issue 23: two `prism emulate --job J` at once both exited 0, one emulation/ kept, both on one core.
    (With PRISM_LOCK_WAIT=0 the second is refused at once; by default it waits for the first.)"""
    monkeypatch.setenv("PRISM_LOCK_WAIT", "0")
    inner = fake_launcher(job, [2], [])
    second = {}

    def launch(cmd, out):
        second["code"] = stage.main(["--job", str(job), "--sandbox", "3", "--force"])
        second["err"] = capsys.readouterr().err
        return inner(cmd, out)

    stage.emulate(job, "2", launch=launch)
    assert second["code"] == 2, second["err"]
    assert f"{job} is in use by another prism run (pid {os.getpid()}: prism emulate)" in second["err"]
    assert (job / "emulation" / "events.parquet").is_file() and not (job / ".prism.lock").exists()


def test_leftovers_of_a_killed_emulation_are_swept(job):
    """`JOB/.emulation.tmp-PID` of an emulation killed outright is removed by the next one (it holds the lock)."""
    dead = job / ".emulation.tmp-999999999"
    (dead / "run" / "raw").mkdir(parents=True)
    (job / ".emulation.old-999999999").mkdir()
    stage.emulate(job, "2", launch=fake_launcher(job, [2], []))
    assert not list(job.glob(".emulation*")) and (job / "emulation" / "events.parquet").is_file()


def test_unbalanced_what_if_quotes_are_one_line(job, capsys):
    code, err = run_main(["--job", job, "--what-if-args", "--fault 'raise"], capsys)
    assert code == 2 and "--what-if-args" in err and "No closing quotation" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (job / "emulation").exists()


def _session(sid: int) -> list[int]:
    """The live processes of session `sid` (the launcher's: it runs in a session of its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


def _launcher_of(job: Path, timeout: float = 120) -> int:
    """The pid of the `prism launch --mode emulate` of `job`, once its zygote and a rank run (3 processes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            except OSError:
                continue
            if b"emulate" in cmd and b"launch" in cmd and str(job).encode() in cmd:
                if len(_session(int(entry.name))) >= 3:
                    return int(entry.name)
        time.sleep(0.2)
    raise AssertionError("the emulation's launcher did not start its ranks")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_emulate_stops_its_launcher_and_ranks(job, sig):
    """Issue 23: SIGTERM or SIGKILL of `prism emulate` left `prism launch --mode emulate` (its own session), the
    zygote and the rank running, and JOB/.emulation.tmp-PID behind."""
    slow = "--extra-compute-ms 3000 --extra-compute-rank 3"
    proc = subprocess.Popen([sys.executable, "-m", "prism.cli", "emulate", "--job", str(job), "--sandbox", "3",
                             "--devices", "1", "--what-if-args", slow], cwd=REPO, env=make_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        launcher = _launcher_of(job)
        proc.send_signal(sig)
        err = proc.communicate(timeout=30)[1]
        deadline = time.monotonic() + 30
        while _session(launcher) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session(launcher), f"left running: {_session(launcher)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + sig and "stopped by SIGTERM" in err, err
        assert not list(job.glob(".emulation*")), list(job.glob(".emulation*"))
    else:  # killed outright: its staging stays until the next emulation of the job sweeps it
        stage.emulate(job, "2", launch=fake_launcher(job, [2], []))
        assert not list(job.glob(".emulation*"))
    assert not (job / "emulation" / "logs" / "rank=3.log").exists()


def test_more_steps_than_captured_are_refused(job, capsys):
    """Issue 23: `--steps 99` on a short capture was silently clamped."""
    code, err = run_main(["--job", job, "--steps", "99"], capsys)
    assert code == 2 and "--steps 99: the capture has 2 step(s); give at most 2" in err, err
    assert not (job / "emulation").exists() and not list(job.glob(".emulation*"))
