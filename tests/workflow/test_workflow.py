"""Workflow level: the Snakefile lints clean, dry-runs, and runs the tiny job end to end (then is cached)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, data_path, run_prism
from tests.workflow.runs import snakemake, tiny_args


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_default_config_dry_run(tmp_path):
    proc = snakemake("--profile", "profiles/local", "-n", "--config", f"results={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for rule in ("capture", "graph", "summary"):
        assert f"rule {rule}:" in out or f"\n{rule} " in out, rule
    # `baseline: auto` is decided where the baseline would run (the baseline_decision checkpoint), not here on
    # the submitting host: the dry run schedules the decision, and the run itself only once it is known
    assert "baseline_decision" in out and "rule baseline_run:" not in out and "rule baseline_graph:" not in out


def _decide_the_baseline(results, configfile=None):
    """Run the baseline_decision checkpoint alone (it only writes baseline-decision.json): after it, a dry run knows
    whether the baseline runs."""
    target = f"{results}/tiny/baseline-decision.json"
    proc = snakemake(target, "--profile", "profiles/local", "--configfile", str(configfile or data_path("tiny.yaml")),
                     "--config", f"results={results}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(open(target).read())


def test_tiny_config_dry_run_includes_the_baseline(tmp_path):
    dry = ("--profile", "profiles/local", "-n", "--configfile", str(data_path("tiny.yaml")),
           "--config", f"results={tmp_path}")
    proc = snakemake(*dry)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    for rule in ("baseline_decision", "capture", "graph", "summary", "emulate"):
        assert rule in out, rule
    assert "rule baseline_run:" not in out  # not before it is decided, where it would run
    assert "--sandbox 1 --devices 1" in out  # the config's emulate section, as the stage's options
    decided = _decide_the_baseline(tmp_path)  # W=2 fits this machine's cores
    assert decided["run"] is True, decided
    out = snakemake(*dry).stdout
    for rule in ("baseline_run", "baseline_graph", "baseline_summary"):
        assert f"rule {rule}:" in out, rule
    assert "baseline_decision" not in out


def test_emulate_runs_only_when_the_config_asks(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(data_path("tiny.yaml").read_text() + "  run: false\n")  # the emulate section is last
    proc = snakemake("--profile", "profiles/local", "-n", "--configfile", str(plain), "--config",
                     f"results={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rule emulate" not in proc.stdout + proc.stderr and "calibrate" in proc.stdout + proc.stderr


def test_bad_config_is_rejected_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: bad\nnproc: 2\nworkload: {module: m}\nbaseline: {run: sometimes}\n")
    proc = snakemake("--profile", "profiles/local", "-n", "--configfile", str(bad))
    assert proc.returncode != 0
    assert "sometimes" in proc.stdout + proc.stderr


def test_rules_get_threads_and_resources_from_the_config(tmp_path):
    """W=2 on P=1: timing-critical stages ask for 2 cores and a node of their own; no bare `python` anywhere."""
    one_slot = tmp_path / "one_slot.yaml"
    one_slot.write_text(data_path("tiny.yaml").read_text() + "capture: {devices: 1}\n")
    decide = snakemake("--profile", "profiles/slurm", "-n", "--configfile", str(one_slot), "--config",
                       f"results={tmp_path}", "-p")
    block = decide.stdout.split("checkpoint baseline_decision:")[1].split("\n\n")[0]
    assert re.search(r"cpus_per_task=2\b", block) and "exclusive" not in block, block  # what the baseline run would get
    _decide_the_baseline(tmp_path, one_slot)
    proc = snakemake("--profile", "profiles/slurm", "-n", "--configfile", str(one_slot),
                     "--config", f"results={tmp_path}", "-p")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    blocks = {b.split(":", 1)[0].split()[-1]: b for b in out.split("\nrule ")[1:]}
    assert "cpus_per_task=1," in blocks["capture"] and "slurm_extra=--exclusive" in blocks["capture"]
    assert "timing_critical=1" in blocks["capture"] and "gpu=" not in blocks["capture"]
    assert "cpus_per_task=2," in blocks["baseline_run"] and "slurm_extra=--exclusive" in blocks["baseline_run"]
    assert "exclusive" not in blocks["graph"]
    assert "python -m" not in out and "$PY -m prism.capture" in out
    cuda = snakemake("--profile", "profiles/slurm", "-n", "--configfile", str(data_path("tiny.yaml")),
                     "--config", f"results={tmp_path}", "device=cuda", "baseline={run: never}")
    if cuda.returncode == 0:  # the config schema knows `device` (issue 13)
        out = cuda.stdout + cuda.stderr
        capture = [b for b in out.split("\nrule ")[1:] if b.startswith("capture:")][0]
        assert "gpu=2" in capture, capture


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("artifact", ["graph/events.parquet", "baseline/graph/events.parquet",
                                      "slices/slice=0/events.parquet", "calibrated/timeline.parquet",
                                      "calibrated/critical_path.parquet", "emulation/events.parquet"])
def test_every_timeline_of_the_tiny_job_is_one_clock(tiny_reference, artifact):
    """Per (rank, stream), events in order and not overlapping (`prism.schemas.check_timeline`, which every stage
    runs before it writes): capture, baseline, slice run, calibration, its critical path, emulation."""
    from prism import schemas

    table = pq.read_table(tiny_reference / artifact)
    assert table.num_rows and schemas.timeline_problem(table) is None


@pytest.mark.parametrize("timeline", ["capture", "calibrated", "baseline", "emulation"])
def test_the_tiny_jobs_exports_are_valid_traces(tiny_reference, tmp_path, timeline):
    """Perfetto: tracks sorted, not overlapping, flows forward (tests/tef.py); Kineto: the same per rank, device
    streams one kernel at a time. The calibrated timeline is one model clock, and the emulation's computed rows
    are swept from its live ones (`prism.emulate.tail`): every arrow of both is kept. A measured timeline's ranks
    are separate processes: an arrow whose receiver completed before its sender issued is left out and counted.
    (Before the tail sweep the emulation left out 1 of 72 arrows in 3 of 14 runs: a replayed rank's computed
    last wait ended before the sandbox's measured issue of that all-reduce; scripts/emulation_flows.py.)"""
    import json

    from prism.report import export
    from tests.tef import problems

    trace = json.loads(export.export(tiny_reference, timeline, "perfetto", tmp_path / "t.json").read_text())
    kept = sum(e["ph"] == "s" for e in trace["traceEvents"])
    left_out = trace["otherData"]["flows_left_out"]
    assert problems(trace) == [] and kept > 0
    assert left_out == 0 if timeline in ("calibrated", "emulation") else left_out <= (kept + left_out) // 10
    folder = export.export(tiny_reference, timeline, "kineto", tmp_path / "k")
    for path in sorted(folder.iterdir()):
        assert problems(json.loads(path.read_text()), strict_tracks=lambda pid, tid: pid == export.DEVICE_PID) == []


def test_the_report_shows_the_emulation_summary_figures(tiny_reference):
    """The tiny job's real emulation: the report's emulation section holds the summary's figures, verbatim, and
    the rank's table row the same numbers (prism/emulate/results.py computes both)."""
    import html
    import re

    summary = (tiny_reference / "emulation" / "summary.txt").read_text()
    page = html.unescape((tiny_reference / "report" / "report.html").read_text())
    section = page[page.index("Emulation: sandbox ranks"):]
    lines = summary[summary.index("job iteration time"):summary.index("\n\n", summary.index("job iteration time"))]
    assert lines.strip() and lines in section
    measured = re.search(r"rank 1: measured ([\d.]+) ms", summary).group(1)
    row = re.search(r"<tr><td class='n'>1</td><td class='n'>([\d.]+)</td>", section).group(1)
    assert row == measured


def test_tiny_job_end_to_end_then_cached(tiny_reference, tmp_path):
    captured = (tiny_reference / "summary.txt").read_text()
    assert "capture: 2 ranks on 2 device slots" in captured and "mode: capture, device: cpu" in captured
    # the job's catalog holds prediction and baseline side by side: the README's join answers
    readme = (REPO / "README.md").read_text()
    join = re.search(r'prism sql --job results/tiny "\n(.*?)"\n```', readme, re.S).group(1)
    con = duckdb.connect(str(tiny_reference / "prism.duckdb"), read_only=True)
    con.execute(f"SET file_search_path = '{tiny_reference}'")  # the catalog's paths are relative to the job folder
    rows = con.execute(join).fetchall()
    con.close()
    assert len(rows) == 3 and all(p > 0 and m > 0 for _, p, m in rows[1:]), rows
    job = tiny_reference / "baseline"
    summary = (job / "summary.txt").read_text()
    assert "ranks: 2" in summary and "iterations: 3" in summary and "iteration time" in summary
    # one catalog, written by the catalog rule alone: the baseline's tables are its `baseline` schema
    assert not (job / "prism.duckdb").exists()
    con = duckdb.connect(str(tiny_reference / "prism.duckdb"), read_only=True)
    con.execute(f"SET file_search_path = '{tiny_reference}'")  # the catalog's paths are relative to the job folder
    assert con.execute("SELECT count(*) FROM baseline.ranks").fetchone()[0] == 2
    n_comms = con.execute("SELECT count(*) FROM baseline.comms").fetchone()[0]
    con.close()
    assert n_comms > 0
    decided = json.loads((tiny_reference / "baseline-decision.json").read_text())
    assert decided["run"] is True and decided["nproc"] == 2 and "fit" in decided["reason"], decided
    # README query: per-rank iteration time
    q = run_prism(["sql", "--job", str(job), "--csv",
                   "SELECT rank, count(*) AS n FROM events WHERE op = 'iteration_end' GROUP BY rank ORDER BY rank"])
    assert q.returncode == 0, q.stderr
    assert q.stdout.split() == ["rank,n", "0,3", "1,3"]
    # nothing changed: nothing is scheduled
    again = snakemake(*tiny_args(tiny_reference.parent), "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    # the emulation ran (its config section), and changing only its settings re-runs only it
    emulated = (tiny_reference / "emulation" / "summary.txt").read_text()
    assert "sandbox rank(s) 1 of W=2" in emulated
    other = tmp_path / "other_sandbox.yaml"
    other.write_text(data_path("tiny.yaml").read_text().replace('sandbox: "1"', 'sandbox: "0"'))
    changed = snakemake("--profile", "profiles/local", "--configfile", str(other), "--config",
                        f"results={tiny_reference.parent}", "-n")
    out = changed.stdout + changed.stderr
    assert "rule emulate:" in out, out
    for rule in ("capture", "graph", "slice_run", "calibrate", "summary", "baseline_run"):
        assert f"rule {rule}:" not in out, rule
    # a slice run reads the capture's payloads: one that must run again without them gets the capture re-run
    # first (were they undeclared, the slice run alone would be scheduled, and fail for want of payloads).
    # On a copy (mtimes kept): the reference job is shared by other tests.
    copy = tmp_path / "copy"
    shutil.copytree(tiny_reference, copy / "tiny", symlinks=True)
    shutil.rmtree(copy / "tiny" / "capture" / "payloads")
    events = copy / "tiny" / "slices" / "slice=0" / "events.parquet"
    events.unlink()
    lost = snakemake(*tiny_args(copy), "-n", str(events))
    out = lost.stdout + lost.stderr
    assert lost.returncode == 0, out
    assert f"Missing output files: {copy / 'tiny' / 'capture' / 'payloads'}" in out, out
    for rule in ("rule capture:", "rule graph:", "checkpoint slice_plan:", "rule slice_run:"):
        assert rule in out, (rule, out)
    # calibration iterated once (`calibrate: {timed_slices: true}`, off by default): on a copy of the finished
    # job only the timed pass runs (first calibration, timed slice runs, their durations, calibrated/ again)
    timed = tmp_path / "timed.yaml"
    timed.write_text(data_path("tiny.yaml").read_text() + "calibrate:\n  timed_slices: true\n")
    copy = tmp_path / "timed_copy"
    shutil.copytree(tiny_reference, copy / "tiny", symlinks=True)
    target = copy / "tiny" / "calibrated" / "timeline.parquet"
    shutil.rmtree(copy / "tiny" / "calibrated")  # (the copy has no Snakemake metadata: a new input is no trigger)
    run = snakemake(str(target), "--profile", "profiles/local", "--configfile", str(timed), "--config",
                    f"results={copy}")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    for rule in ("rule calibrate_untimed:", "rule slice_run_timed:", "rule slice_durations_timed:", "rule calibrate:"):
        assert rule in out, (rule, out)
    for rule in ("rule capture:", "rule graph:", "rule slice_run:"):
        assert rule not in out, (rule, out)
    # W=2 on P=2: one slice of both ranks, nothing replayed; the timed pass still writes its (empty) issue table
    replay = copy / "tiny" / "slices_timed" / "slice=0" / "replay.parquet"
    assert pq.read_table(replay).column_names == ["comm_id", "t_issue_ns"]


@pytest.mark.slow
def test_every_file_a_stage_writes_is_a_declared_output(tiny_reference):
    """What a stage writes beside its declared outputs is invisible to Snakemake: not removed by a re-run of the
    rule, not re-made when deleted, not part of `--summary`. Every file of the tiny job is a rule's output, lies
    in a declared output folder, or is a log."""
    proc = snakemake(*tiny_args(tiny_reference.parent), "--summary")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    declared = {Path(line.split("\t")[0]) for line in proc.stdout.splitlines() if line.startswith("/")}
    assert declared, proc.stdout
    undeclared = [path.relative_to(tiny_reference) for path in tiny_reference.rglob("*")
                  if path.is_file() and "logs" not in path.relative_to(tiny_reference).parts
                  and not any(path == d or d in path.parents for d in declared)]
    assert undeclared == []
