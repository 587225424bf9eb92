"""Workflow level: the tiny job's pipeline ends with its report, linked into `snakemake --report`; the report
opens clean in headless Chromium; every timeline of the real job exports (Perfetto, Kineto loaded by HTA)."""

from __future__ import annotations

import json
import zipfile

import pytest

from prism.report import export
from tests.browser import external_resources, open_page, plots_without_data
from tests.workflow.runs import snakemake, tiny_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tiny_reference):
    """The session's one local run of the tiny job (tests/workflow/conftest.py) and the arguments it ran with:
    these tests only read it."""
    return tiny_reference, tiny_args(tiny_reference.parent)


def test_pipeline_ends_with_the_report_and_snakemake_report_links_it(tiny, tmp_path):
    job, args = tiny
    page = job / "report" / "report.html"
    assert page.is_file() and external_resources(page.read_text()) == []
    archive = tmp_path / "snakemake-report.zip"
    proc = snakemake(*args, "--report", str(archive))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with zipfile.ZipFile(archive) as zf:
        linked = [n for n in zf.namelist() if n.endswith("report.html") and "/data/raw/" in n]
        assert linked, zf.namelist()[:20]
        assert zf.read(linked[0]) == page.read_bytes()


def test_report_of_the_tiny_job_in_chromium(tiny, tmp_path):
    job, _ = tiny
    result = open_page(job / "report" / "report.html", tmp_path)
    assert result.errors == []
    n_plots, empty = plots_without_data(result.dom)
    assert n_plots >= 6 and empty == []  # with the baseline: its two plots
    assert "Prediction against the baseline" in result.dom and "Critical path" in result.dom


@pytest.mark.parametrize("timeline", ["capture", "calibrated", "baseline"])
def test_every_timeline_exports(tiny, tmp_path, timeline):
    job, _ = tiny
    trace = json.loads(export.export(job, timeline, "perfetto", tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["pid"] for e in trace if e["ph"] == "X"} == {0, 1}
    flows = [e for e in trace if e["ph"] in ("s", "f")]
    assert flows and len(flows) % 2 == 0  # the tiny job communicates: arrows between the ranks
    assert all(e["dur"] >= 0 for e in trace if e["ph"] == "X")


def test_kineto_of_the_tiny_job_loads_in_hta(tiny, tmp_path):
    from hta.trace_analysis import TraceAnalysis

    job, _ = tiny
    folder = export.export(job, "calibrated", "kineto", tmp_path / "kineto")
    breakdown = TraceAnalysis(trace_dir=str(folder)).get_temporal_breakdown(visualize=False)
    assert sorted(breakdown["rank"]) == [0, 1]
    assert (breakdown["compute_time(us)"] > 0).all() and (breakdown["non_compute_time(us)"] > 0).all()
