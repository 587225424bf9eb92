"""The trace exports as tools read them: a Trace Event Format check (tests/tef.py: tracks sorted, not
overlapping, named; flows forward and inside slices) on every timeline of the hand-made job, group names in
the args, and Holistic Trace Analysis's temporal breakdown, comm/comp overlap, idle time and queue length on
the Kineto export with no negative values."""

from __future__ import annotations

import json
import logging

import pytest

from prism.report import export
from tests.report_job import ITERATIONS, make_job
from tests.tef import problems


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_job(tmp_path_factory.mktemp("exports") / "job", baseline=True, emulation=True)


@pytest.mark.parametrize("timeline", ["capture", "calibrated", "baseline", "emulation"])
def test_perfetto_is_valid_trace_event_format(job, timeline):
    trace = json.loads(export.export(job, timeline, "perfetto").read_text())
    assert problems(trace) == []
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    left_out = trace["otherData"]["flows_left_out"]
    assert len(flows) + left_out == 2 * ITERATIONS
    # one clock for the job: every arrow kept. The hand-made capture, baseline and emulation have a clock per
    # rank (each from its own 0; the emulation's rank 1 stretched by 5 %): rank 1 "arrives" after rank 0 completed
    assert left_out == (0 if timeline == "calibrated" else ITERATIONS)


def test_perfetto_flows_run_from_the_issue_to_the_completion(job):
    trace = json.loads(export.export(job, "calibrated", "perfetto").read_text())["traceEvents"]
    x = [e for e in trace if e["ph"] == "X"]
    starts = {e["id"]: e for e in trace if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace if e["ph"] == "f"}
    for i, s in starts.items():
        f = ends[i]
        src = [e for e in x if e["pid"] == s["pid"] and e["ts"] == s["ts"] and e["cat"] in ("send", "collective")]
        assert src, s  # the arrow leaves at an issue (the send, the collective member that arrived last)
        dst = [e for e in x if e["pid"] == f["pid"] and e["cat"] == "wait" and e["ts"] <= f["ts"] <= e["ts"] + e["dur"]]
        assert dst and f["ts"] >= s["ts"] and f["ts"] >= dst[0]["ts"] + dst[0]["dur"] - 0.001, (s, f)


def test_perfetto_args_name_groups_and_their_ranks(job):
    trace = json.loads(export.export(job, "calibrated", "perfetto").read_text())["traceEvents"]
    groups = {e["args"]["group"] for e in trace if e["ph"] == "X" and "group" in e["args"]}
    assert groups == {"dp[0,1]"}


def test_kineto_tracks(job, tmp_path):
    folder = export.export(job, "emulation", "kineto", tmp_path / "k")
    for rank in (0, 1):
        trace = json.loads((folder / f"rank-{rank}.json").read_text())
        device = export.DEVICE_PID
        # device streams: one kernel at a time; the host thread: ops nested in their ProfilerStep
        assert problems(trace, strict_tracks=lambda pid, tid: pid == device) == []
        ev = trace["traceEvents"]
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        host = [e for e in ev if e.get("cat") == "cpu_op"]
        assert {e["pid"] for e in kernels} == {device} and {e["pid"] for e in host} == {export.HOST_PID + rank}
        names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"
                 and e["pid"] == device}
        assert names == {7: "stream 7 (compute)", 20: "stream 20 (communication)"}
        assert {e["args"]["Process Group Name"] for e in kernels if "Process Group Name" in e["args"]} >= {"dp[0,1]"}


def _no_negative(frame, what):
    numbers = frame.select_dtypes("number")
    assert not (numbers < 0).any().any(), f"{what}: negative values\n{frame}"


@pytest.mark.parametrize("timeline", ["calibrated", "emulation"])
def test_hta_analyses_have_no_negative_values(job, tmp_path, timeline):
    from hta.trace_analysis import TraceAnalysis  # a test extra: pip install -e '.[test]'

    logging.getLogger("hta").setLevel(logging.ERROR)
    folder = export.export(job, timeline, "kineto", tmp_path / "kineto")
    analysis = TraceAnalysis(trace_dir=str(folder))
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert sorted(breakdown["rank"]) == [0, 1]
    _no_negative(breakdown, "temporal breakdown")
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    _no_negative(overlap, "comm/comp overlap")
    idle = analysis.get_idle_time_breakdown(visualize=False)
    idle = idle[0] if isinstance(idle, tuple) else idle
    _no_negative(idle, "idle time breakdown")
    queue = analysis.get_queue_length_summary()
    assert queue is not None and len(queue)
    _no_negative(queue, "queue length")
