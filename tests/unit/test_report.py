"""The report and the trace exports on a job written by hand (tests/report_job.py): the figures' numbers,
the page in headless Chromium, Perfetto flows, the Kineto export loaded by Holistic Trace Analysis."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import plotly.graph_objects as go
import polars as pl
import pytest

from prism.report import data, export
from prism.report.html import Page
from prism.report.stage import write_report
from tests.browser import external_resources, open_page, plots_without_data
from tests.conftest import REPO
from tests.report_job import COMPUTE_NS, ITERATIONS, make_job


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_job(tmp_path_factory.mktemp("report") / "job", baseline=True, emulation=True)


def test_time_breakdown_by_hand():
    events = pl.DataFrame({
        "event_id": [0, 1, 2, 3, 4], "rank": [0, 0, 0, 0, 1], "iteration": [1, 1, 1, 0, 1],
        "kind": ["compute", "collective", "wait", "compute", "compute"],
        "start_ns": [0, 5_000_000, 6_000_000, 0, 0], "end_ns": [5_000_000, 6_000_000, 10_000_000, 7, 2_000_000],
    })
    own = pl.DataFrame({"event_id": [0, 1, 2, 3, 4], "duration_ns": [5_000_000, 1_000_000, 1_000_000, 7, 2_000_000]})
    got = data.time_breakdown(events, own).to_dicts()
    # rank 0, iteration 1: compute 5 ms; collective 1 ms + the wait's own 1 ms; the wait blocked 3 ms
    assert got == [{"rank": 0, "compute_ms": 5.0, "communication_ms": 2.0, "idle_ms": 3.0},
                   {"rank": 1, "compute_ms": 2.0, "communication_ms": 0.0, "idle_ms": 0.0}]
    without = data.time_breakdown(events, None).to_dicts()[0]
    assert without == {"rank": 0, "compute_ms": 5.0, "communication_ms": 5.0, "idle_ms": 0.0}


def test_marker_iterations_and_per_rank_median():
    events = pl.DataFrame({"rank": [0, 0, 0, 1, 1, 1], "iteration": [0, 1, 2, 0, 1, 2],
                           "kind": ["marker"] * 6, "op": ["iteration_end"] * 6,
                           "end_ns": [10, 30, 60, 12, 22, 52]})
    its = data.marker_iterations(events)
    assert its["duration_ns"].to_list() == [None, 20, 30, None, 10, 30]
    per_rank = data.per_rank_iteration(its)
    assert per_rank["rank"].to_list() == [0, 1]
    assert per_rank["median_ms"].to_list() == pytest.approx([25e-6, 20e-6])
    # the job's iteration k ends at its last rank's end: 12, 30, 60 -> gaps 18, 30 ns
    assert data.job_iteration_time(its)["gaps_ms"] == pytest.approx([18e-6, 30e-6])


def test_calibrated_figures_of_the_hand_made_job(job):
    tl = data.load_timeline(job, "calibrated")
    assert tl.world == 2 and tl.events.height == 2 * ITERATIONS * 6
    mem = data.peak_memory(tl.events).to_dicts()
    assert mem == [{"rank": 0, "peak_mib": 1.0}, {"rank": 1, "peak_mib": 2.0}]
    br = data.time_breakdown(tl.events, None)
    assert br["compute_ms"].to_list() == [c * (ITERATIONS - 1) / 1e6 for c in COMPUTE_NS]


def test_perfetto_export_has_a_track_per_rank_and_stream_and_flows(job):
    path = export.export(job, "calibrated", "perfetto")
    trace = json.loads(path.read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    assert {(e["pid"], e["tid"]) for e in trace if e["ph"] == "M" and e["name"] == "thread_name"} == {(0, 0), (1, 0)}
    assert sum(e["ph"] == "X" for e in trace) == 2 * ITERATIONS * 6
    starts = {e["id"]: e for e in trace if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 2 * ITERATIONS
    # all_reduce: rank 1 computes longer and arrives last -> rank 0's wait; send (rank 0) -> rank 1's wait
    arrows = sorted((starts[i]["name"], starts[i]["pid"], ends[i]["pid"]) for i in starts)
    assert arrows == [("all_reduce", 1, 0)] * ITERATIONS + [("send", 0, 1)] * ITERATIONS
    x = {(e["pid"], e["args"]["event_id"]): e for e in trace if e["ph"] == "X"}
    for i, f in ends.items():  # each arrow ends inside a wait of the receiving rank
        inside = [e for (pid, _), e in x.items() if pid == f["pid"] and e["ts"] <= f["ts"] <= e["ts"] + e["dur"]]
        assert any(e["cat"] == "wait" for e in inside), f


def test_kineto_export_loads_in_hta(job, tmp_path):
    from hta.trace_analysis import TraceAnalysis  # a test extra: pip install -e '.[test]'

    logging.getLogger("hta").setLevel(logging.ERROR)
    folder = export.export(job, "calibrated", "kineto", tmp_path / "kineto")
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.json", "rank-1.json"]
    analysis = TraceAnalysis(trace_dir=str(folder))
    breakdown = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    assert sorted(breakdown.index) == [0, 1]
    # HTA leaves out the first ProfilerStep: iterations 1..2 of compute kernels, in us
    for rank, compute_ns in enumerate(COMPUTE_NS):
        assert breakdown.loc[rank, "compute_time(us)"] == compute_ns * (ITERATIONS - 1) / 1e3
    assert breakdown.loc[0, "non_compute_time(us)"] > breakdown.loc[1, "non_compute_time(us)"]  # rank 0 waits


def test_export_errors_name_the_missing_stage(tmp_path):
    make_job(tmp_path / "j", baseline=False)
    proc = subprocess.run([sys.executable, "-m", "prism.cli", "export", "--job", str(tmp_path / "j"), "--timeline",
                           "emulation", "--format", "perfetto"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "emulation/events.parquet is missing" in proc.stderr and "emulat" in proc.stderr
    assert not (tmp_path / "j" / "export").exists() or not any((tmp_path / "j" / "export").iterdir())
    proc = subprocess.run([sys.executable, "-m", "prism.cli", "report", "--job", str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "not a job folder" in proc.stderr


def test_report_without_calibration_is_one_error(tmp_path):
    job = make_job(tmp_path / "j", baseline=False)
    for name in ("timeline", "iterations"):
        (job / "calibrated" / f"{name}.parquet").unlink()
    proc = subprocess.run([sys.executable, "-m", "prism.cli", "report", "--job", str(job)], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 2 and "calibrated/timeline.parquet is missing" in proc.stderr
    assert "prism calibrate" in proc.stderr and not (job / "report").exists()


def test_report_page_in_headless_chromium(job, tmp_path):
    page = write_report(job)
    text = page.read_text()
    assert external_resources(text) == [] and "Plotly.newPlot" in text  # self-contained: plotly.js inlined
    assert external_resources('<script src="https://cdn.plot.ly/x.js"></script>') != []
    result = open_page(page, tmp_path)
    assert result.errors == []
    n_plots, empty = plots_without_data(result.dom)
    # iteration time, timeline, breakdown, memory, emulation x2, baseline x2
    assert n_plots == 8 and empty == []
    for section in ("Critical path", "Emulation: sandbox ranks", "Prediction against the baseline"):
        assert section in result.dom
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "blank.html").write_text("<html><head></head><body></body></html>")
    empty_shot = open_page(blank / "blank.html", blank).screenshot
    assert result.screenshot.stat().st_size > 5 * empty_shot.stat().st_size  # the page is not blank


def test_report_shows_the_emulations_own_delay_per_op_kind(job, tmp_path):
    """The emulation section shows ``emulation/delays.parquet`` (prism/emulate/delays.py): the summary's lines and a
    row per op kind with the table's numbers; an emulation without real exchanges says so."""
    import html
    import re
    import shutil

    from prism import artifacts, schemas
    from prism.emulate import delays
    from prism.report.html import build

    table = delays.read_delays(job)
    page = build(job)
    section = page[page.index("Emulation: its own delay per op kind"):page.index("Emulation: the sandbox ranks")
                   if "Emulation: the sandbox ranks" in page else None]
    assert html.escape("\n".join(delays.text_lines(table))) in section
    assert [r["op"] for r in table.to_pylist()] == ["all_reduce", "send/recv"]
    for row in table.to_pylist():
        cells = re.search(rf"<tr><td>{re.escape(row['op'])}</td>(.*?)</tr>", section).group(1)
        assert re.findall(r"<td class='n'>(-?[\d.]+)</td>", cells)[:7] == [str(row["n"])] + [
            f"{row[k]:.2f}" for k in ("late_median_ms", "late_p95_ms", "late_max_ms", "late_mean_ms",
                                      "late_ms_per_iteration", "vs_calibrated_median_ms")]
    assert table.to_pylist()[1]["late_ms_per_iteration"] == pytest.approx(1.0)  # iterations 1, 2: 1 ms each

    empty = tmp_path / "empty"
    shutil.copytree(job, empty)
    artifacts.write_outputs(empty / "emulation", {"delays": table.slice(0, 0)}, {"delays": schemas.EMULATION_DELAYS},
                            run_id="report-test-run")
    section = build(empty)
    section = section[section.index("Emulation: its own delay per op kind"):]
    assert delays.NO_EXCHANGES in html.unescape(section) and "<td>all_reduce</td>" not in section


def test_browser_check_catches_errors_and_empty_plots(tmp_path):
    """The checks above can fail: a page with a script error and a plot without data."""
    page = Page("broken")
    page.figure(go.Figure(go.Bar(x=[], y=[])))
    page.figure(go.Figure(go.Bar(x=[0, 1], y=[3, 4])))
    page.parts.append("<script>undefinedFunction();</script>")
    path = tmp_path / "bad.html"
    path.write_text(page.render())
    result = open_page(path, tmp_path)
    assert any("undefinedFunction" in e for e in result.errors), result.errors
    assert plots_without_data(result.dom) == (2, ["prism-plot-0"])
