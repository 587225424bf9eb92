"""The fidelity bench's metrics on hand-computed values: the job's iteration ends and time (the one
definition, `prism.iterations`), per-event errors, the table and means of results files (`--summarize`),
and a rescore that scores every saved prism run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.bench import fidelity
from prism.bench.fidelity_table import Config, Result, read_json, summarize, write_json
from prism.iterations import iteration_times, job_iteration_ends

MS = 1_000_000  # ns per ms: the hand values below are written in ms

# ------------------------------------------------------------------------------------ iteration time


def test_job_iteration_ends_take_the_last_rank_of_each_iteration():
    # rank, iteration, end -- rows in no particular order
    rows = [(1, 0, 105), (0, 0, 100), (0, 1, 300), (1, 2, 520), (1, 1, 290), (0, 2, 500)]
    iteration = [r[1] for r in rows]
    end = [r[2] for r in rows]
    assert job_iteration_ends(iteration, end).tolist() == [105, 300, 520]
    times = iteration_times(iteration, end)
    assert times.gaps_ns.tolist() == [195, 220]  # iteration 0 has no gap
    assert times.median_ns == 207.5 and times.min_ns == 195 and times.max_ns == 220 and len(times) == 2


def test_iteration_time_is_the_median_gap_and_needs_two_iterations():
    ends = [0, 10 * MS, 30 * MS, 35 * MS]  # gaps 10, 20, 5 ms
    assert iteration_times(range(4), ends).median_ms == 10.0
    assert fidelity._median_gap_ms(range(4), ends) == 10.0
    assert iteration_times([0, 0], [5, 7]) is None  # one iteration (two ranks): no gap
    with pytest.raises(fidelity.StepError, match="only 1 iteration end"):
        fidelity._median_gap_ms([0, 0], [5, 7])


def test_calibrate_summary_and_bench_report_the_same_iteration_time(tmp_path, capsys):
    from prism import graph, summary
    from prism.calibrate import stage
    from tests.unit.rawgen import RawJob

    # two ranks, no communication; compute per iteration (ms): rank 0 1, 3, 2, 5, 1; rank 1 2.5, 1, 4, 1, 3
    # rank ends: 1, 4, 6, 11, 12 and 2.5, 3.5, 7.5, 8.5, 11.5 -> job ends 2.5, 4, 7.5, 11, 12
    # -> gaps 1.5, 3.5, 3.5, 1: median 2.5 ms (the slowest rank's iteration, 2.5 3 4 5 3, has median 3)
    job = RawJob(2)
    job.group("default_pg", [0, 1])
    for a, b in zip([1, 3, 2, 5, 1], [2.5, 1, 4, 1, 3]):
        for rank, ms in ((0, a), (1, b)):
            job.compute(rank, int(ms * MS))
            job.marker(rank, "iteration_end")
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    assert fidelity._median_gap_ms(*fidelity.truth_ends(tmp_path)) == 2.5
    assert "iteration time (job, iterations 1..4): median 2.50 ms, min 1.00 ms, max 3.50 ms" in \
        summary.summarize(tmp_path)
    capsys.readouterr()
    assert stage.main(["--job", str(tmp_path)]) == 0  # bare-graph durations: the same times here
    assert "ms: 1.50, 3.50, 3.50, 1.00; median 2.50" in capsys.readouterr().out
    assert fidelity._median_gap_ms(*fidelity.calibrated(tmp_path, slices=False)[1]) == 2.5


# ------------------------------------------------------------------------------------ per-event errors

# one rank, iterations 0, 1, 2; (seq, kind, op, iteration, truth start, truth end, predicted start, end) in ms
EVENTS = [
    (0, "compute", "compute", 0, 10, 60, 5, 50),
    (1, "marker", "iteration_end", 0, 100, 100, 90, 90),
    (2, "compute", "compute", 1, 120, 200, 100, 190),
    (3, "marker", "iteration_end", 1, 300, 300, 290, 290),
    (4, "compute", "compute", 2, 330, 400, 320, 380),
    (5, "marker", "iteration_end", 2, 500, 500, 470, 470),
]
TRUTH_ENDS = np.array([100, 300, 500]) * MS
PRED_ENDS = np.array([90, 290, 470]) * MS


def _graphs(tmp_path: Path, capture_ops: list[str] | None = None) -> tuple[Path, Path, pa.Table]:
    truth, capture = tmp_path / "truth" / "graph", tmp_path / "capture" / "graph"
    truth.mkdir(parents=True)
    capture.mkdir(parents=True)
    ranks, seqs = [0] * len(EVENTS), [e[0] for e in EVENTS]
    pq.write_table(pa.table({
        "rank": ranks, "seq": seqs, "kind": [e[1] for e in EVENTS], "op": [e[2] for e in EVENTS],
        "iteration": [e[3] for e in EVENTS], "t_start_ns": [e[4] * MS for e in EVENTS],
        "t_end_ns": [e[5] * MS for e in EVENTS]}), truth / "events.parquet")
    pq.write_table(pa.table({"rank": ranks, "seq": seqs, "kind": [e[1] for e in EVENTS],
                             "op": capture_ops or [e[2] for e in EVENTS]}), capture / "events.parquet")
    timeline = pa.table({"rank": ranks, "seq": seqs, "start_ns": [e[6] * MS for e in EVENTS],
                         "end_ns": [e[7] * MS for e in EVENTS]})
    return truth, capture, timeline


def test_event_errors_by_hand(tmp_path):
    truth, capture, timeline = _graphs(tmp_path)
    got = fidelity.event_errors(truth.parent, capture.parent, timeline, TRUTH_ENDS, PRED_ENDS)
    # iterations >= 1 only (seq 2..5). Start in the iteration, from the job's end of the previous one:
    #   truth 120-100=20, 300-100=200, 330-300=30, 500-300=200; predicted 100-90=10, 200, 30, 470-290=180
    #   -> |errors| 10, 0, 0, 20: median 5, p95 (linear) 10 + 0.85 * 10 = 18.5
    # durations: truth 80, 0, 70, 0; predicted 90, 0, 60, 0 -> 10, 0, 10, 0: median 5, p95 10
    # from the end of iteration 0: truth 20, 200, 230, 400; predicted 10, 200, 230, 380 -> 10, 0, 0, 20
    assert got["aligned"] and got["mismatched"] == 0 and got["n_compared"] == 4
    assert got["n_real"] == got["n_capture"] == 6
    assert got["start_med_ms"] == pytest.approx(5.0) and got["start_p95_ms"] == pytest.approx(18.5)
    assert got["dur_med_ms"] == pytest.approx(5.0) and got["dur_p95_ms"] == pytest.approx(10.0)
    assert got["cum_start_med_ms"] == pytest.approx(5.0) and got["cum_start_p95_ms"] == pytest.approx(18.5)


def test_event_errors_leave_out_events_the_graphs_disagree_on(tmp_path):
    ops = [e[2] for e in EVENTS]
    ops[4] = "something_else"  # seq 4: the capture saw another op
    truth, capture, timeline = _graphs(tmp_path, ops)
    got = fidelity.event_errors(truth.parent, capture.parent, timeline, TRUTH_ENDS, PRED_ENDS)
    # seq 2, 3, 5 remain: start errors 10, 0, 20 -> median 10; durations 10, 0, 0 -> median 0
    assert not got["aligned"] and got["mismatched"] == 1 and got["n_compared"] == 3
    assert got["start_med_ms"] == pytest.approx(10.0) and got["dur_med_ms"] == pytest.approx(0.0)


# ------------------------------------------------------------------------------------ results and table


def _record(name: str, truth: list[float], pred: list[float], bare: list[float]) -> dict:
    return {"config": name, "world": 2, "devices": 1, "layout": ["--dp", "2"], "truth_ms": truth,
            "pred_ms": pred, "bare_ms": bare, "events": {"aligned": True, "start_med_ms": 1.0, "start_p95_ms": 2.0,
                                                         "dur_med_ms": 0.1, "dur_p95_ms": 0.2},
            "stage_s": {}, "error": None}


def test_summarize_computes_the_table_from_the_json_alone(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    # truth median 100 (spread 90-110), prediction median of 3 runs 105: +5.0 %, inside; bare 150: +50.0 %
    one = _record("one", [100, 110, 90], [95, 105, 120], [150, 140, 160])
    one["stage_s"] = {"truth0": 10.0, "prism0-capture": 6.5, "truth1": 12.0, "prism0-slices": 20.0,
                      "truth-graphs": 2.5}
    a.write_text(json.dumps([one]))
    # truth 200, prediction 180: -10.0 %, outside; bare 210: +5.0 %
    b.write_text(json.dumps([_record("two", [200, 205, 198], [180], [210])]))
    text = summarize([a, b])
    assert ("| one | 2 | 1 | --dp 2 | 100.00 | 90.00-110.00 | 105.00 | +5.0 | yes | 1.00/2.00 | 0.100/0.200 | yes "
            "| 150.00 | +50.0 | 3, 95.00-120.00 |") in text
    assert "| two | 2 | 1 | --dp 2 | 200.00 | 198.00-205.00 | 180.00 | -10.0 | no |" in text
    assert f"## {a} (predictions scored by: unrecorded)" in text
    assert ("stage wall times per run (s, min-max): truth 10.0-12.0, truth-graphs 2.5-2.5, capture 6.5-6.5, "
            "slices 20.0-20.0") in text
    together = text.split("all 2 files together")[1]
    assert "inside the truth's spread: 1 of 2" in together
    assert "mean |error| 7.5 %, max 10.0 % (two)" in together  # (5 + 10) / 2
    assert "bare graph (ablation):  mean |error| 27.5 %, max 50.0 %" in together  # (50 + 5) / 2


def test_summarize_names_a_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    assert fidelity.main(["--summarize", str(bad)]) == 2
    assert fidelity.main(["--summarize", str(tmp_path / "missing.json")]) == 2


def test_json_round_trip_keeps_every_run(tmp_path):
    r = Result(Config("x", 2, ("--tp", "2"), 1), 1, truth_ms=[1.0, 2.0], pred_ms=[3.0, 4.0, 5.0], bare_ms=[6.0],
               scored={"at": "2026-01-01T00:00:00Z", "commit": "abc"})
    write_json(tmp_path / "fidelity.json", [r])
    (back,) = read_json(tmp_path / "fidelity.json")
    assert back == r


def test_rescore_scores_every_saved_prism_run_and_refuses_a_partial_folder(tmp_path, monkeypatch):
    saved = [_record("dp2", [100, 100], [1.0, 2.0], [3.0, 4.0]), _record("tp2", [100, 100], [1.0, 2.0], [3.0, 4.0])]
    saved[1]["config"], saved[1]["layout"] = "tp2", ["--tp", "2"]
    (tmp_path / "fidelity.json").write_text(json.dumps(saved))
    for name, runs in (("dp2", 2), ("tp2", 1)):  # tp2 kept only its first prism run
        for i in range(runs):
            (tmp_path / name / f"prism{i}" / "graph").mkdir(parents=True)
    scored = []

    def fake_score(res, job, truth0):  # stands for calibrating a saved run: its number is the run's index
        scored.append((job.name, truth0 is not None))
        res.pred_ms.append(90.0 + int(job.name[-1]))
        res.bare_ms.append(80.0)

    monkeypatch.setattr(fidelity, "score_prism_run", fake_score)
    dp2, tp2 = fidelity.rescore([tmp_path])
    assert scored == [("prism0", True), ("prism1", False)]  # per-event errors from the first run only
    assert dp2.pred_ms == [90.0, 91.0] and dp2.error is None and dp2.scored["at"]
    assert tp2.pred_ms == [] and "prism1 missing" in tp2.error

    out = tmp_path / "rescored"
    assert fidelity.main(["--rescore", str(tmp_path), "--out", str(out)]) == 1  # tp2 failed
    written = json.loads((out / "fidelity.json").read_text())
    assert written[0]["pred_ms"] == [90.0, 91.0] and written[0]["truth_ms"] == [100, 100]
    assert "| dp2 |" in (out / "fidelity.md").read_text()


def test_cores_follow_the_affinity(monkeypatch):
    monkeypatch.setattr(fidelity.os, "sched_getaffinity", lambda pid: {3})
    assert fidelity.usable_cores() == 1
    monkeypatch.setattr(fidelity.os, "sched_getaffinity", lambda pid: {3})
    assert fidelity.main(["--configs", "dp2", "--repeats", "1"]) == 2  # W=2 does not fit one usable core


# ------------------------------------------------------------------------------ the doc is the JSON


def test_docs_fidelity_figures_are_what_the_committed_json_gives():
    """Each `prism bench fidelity --summarize FILES` in docs/fidelity.md is followed by rows and figures
    (mean |error| ..., max ...; bare graph ...; N of M inside) that the command prints from those files."""
    import re

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "fidelity.md").read_text()
    parts = re.split(r"`prism bench fidelity --summarize ([^`*]+\.json)`", doc)
    checked = 0
    for files, section in zip(parts[1::2], parts[2::2]):
        section = section.split("\n## ")[0].split("\n### ")[0]
        out = summarize([root / f for f in files.split()])
        rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(
            ("| config ", "| file "))]
        assert rows, files
        for line in rows:
            assert line in out, f"{files}: {line}"
        text = " ".join(section.split())
        for mean, worst in re.findall(r"mean \|error\| ([\d.]+) %, max ([\d.]+) %", text):
            assert f"mean |error| {mean} %, max {worst} %" in out, (files, mean, worst)
        for bare in re.findall(r"bare graph ([\d.]+) %", text):
            assert f"bare graph (ablation):  mean |error| {bare} %" in out, (files, bare)
        for inside, n in re.findall(r"(\d+) of (\d+) inside", text):
            assert f"inside the truth's spread: {inside} of {n}" in out, (files, inside, n)
        checked += 1
    assert checked == 10


def test_readme_fidelity_figures_are_what_the_committed_json_gives():
    import re

    root = Path(__file__).resolve().parents[2]
    text = " ".join((root / "README.md").read_text().split())
    claims = re.findall(r"`((?:[\w.-]+\.json ?)+)`: \**([\d.]+) %", text)
    assert len(claims) == 12, claims
    for files, mean in claims:
        out = summarize([root / "docs" / "results" / "fidelity" / f for f in files.split()])
        last = [line for line in out.splitlines() if line.startswith("calibrated from slices:")][-1]
        assert last.startswith(f"calibrated from slices: mean |error| {mean} %"), (files, last)


# ------------------------------------------------------- first pass and emulated sandbox (fidelity_sandbox)


def test_rank_iteration_ms_is_each_ranks_own_median_gap():
    from prism.bench.fidelity_sandbox import rank_iteration_ms

    # rank 0 ends 0, 10, 30, 35 ms (gaps 10, 20, 5: median 10); rank 1 ends 2, 4 (gap 2); rank 2 one end only
    rank = [0, 1, 0, 0, 1, 0, 2]
    iteration = [0, 0, 1, 2, 1, 3, 0]
    end = [0, 2 * MS, 10 * MS, 30 * MS, 4 * MS, 35 * MS, 9 * MS]
    assert rank_iteration_ms(rank, iteration, end, 4) == [10.0, 2.0, None, None]


def test_sandbox_fills_the_default_ranks_slice(tmp_path):
    """The bench's sandbox: the emulate stage's default rank (the smallest rank of the last pipeline stage)
    first, then the other ranks of its slice in the plan; alone with whole_slice=False."""
    from prism.bench.fidelity_sandbox import sandbox_ranks

    (tmp_path / "graph").mkdir()
    (tmp_path / "slices").mkdir()
    # 8 ranks, pp=2 (ranks 4-7 the last stage): default rank 4
    pq.write_table(pa.table({"rank": list(range(8)), "pp": [0] * 4 + [1] * 4, "tp": [0, 1] * 4}),
                   tmp_path / "graph" / "ranks.parquet")
    pq.write_table(pa.table({"rank": [0, 1, 2, 3, 4, 5, 6, 7], "slice": [0, 1, 0, 1, 2, 1, 2, 2]}),
                   tmp_path / "slices" / "plan.parquet")
    assert sandbox_ranks(tmp_path, whole_slice=True) == [4, 6, 7]
    assert sandbox_ranks(tmp_path, whole_slice=False) == [4]


def test_sandbox_event_errors_by_hand():
    from prism.bench.fidelity_sandbox import sandbox_event_errors

    def cols(rows):  # (seq, iteration, start ms, end ms)
        return {"seq": [r[0] for r in rows], "iteration": [r[1] for r in rows],
                "start_ns": [r[2] * MS for r in rows], "end_ns": [r[3] * MS for r in rows]}

    # seq 0 is iteration 0 (left out); seq 1..4 in iteration 1; seq 5 only the truth has
    truth = cols([(0, 0, 0, 5), (1, 1, 10, 20), (2, 1, 20, 24), (3, 1, 24, 40), (4, 1, 40, 41), (5, 1, 41, 50)])
    sandbox = cols([(0, 0, 100, 200), (1, 1, 300, 312), (2, 1, 312, 316), (3, 1, 316, 330), (4, 1, 330, 331)])
    pred = cols([(0, 0, 0, 1), (1, 1, 1, 10), (2, 1, 10, 15), (3, 1, 15, 31), (4, 1, 31, 35)])
    got = sandbox_event_errors(truth, sandbox, pred, compute={1, 3})
    # durations: truth 10, 4, 16, 1; sandbox 12, 4, 14, 1 -> |err| 2, 0, 2, 0: median 1, p95 2
    #            prediction 9, 5, 16, 4 -> |err| 1, 1, 0, 3: median 1, p95 (linear) 1 + 0.85 * 2 = 2.7
    # compute (seq 1, 3): truth 26, sandbox 26 (+0 %), prediction 25 (-1/26 = -3.846 %)
    assert got["n_compared"] == 4
    assert got["sandbox_dur_med_ms"] == pytest.approx(1.0) and got["sandbox_dur_p95_ms"] == pytest.approx(2.0)
    assert got["pred_dur_med_ms"] == pytest.approx(1.0) and got["pred_dur_p95_ms"] == pytest.approx(2.7)
    assert got["sandbox_compute_err_pct"] == pytest.approx(0.0)
    assert got["pred_compute_err_pct"] == pytest.approx(-100.0 / 26)


def _iterated_record(name: str, truth: list[float], pred: list[float], untimed: list[float], emulated: dict) -> dict:
    rec = _record(name, truth, pred, [1.0])
    rec.update(pred_untimed_ms=untimed, emulated=[emulated],
               truth_rank_ms=[[t - 10.0, t - 5.0] for t in truth])  # rank 1's own time: truth - 5
    return rec


def test_summarize_shows_the_first_pass_and_the_emulated_sandbox(tmp_path):
    events = {"sandbox_dur_med_ms": 0.1, "sandbox_dur_p95_ms": 0.9, "pred_dur_med_ms": 0.2, "pred_dur_p95_ms": 1.5,
              "sandbox_compute_err_pct": 2.0, "pred_compute_err_pct": -3.0}
    a = _iterated_record("dp2", [100.0, 110.0, 90.0], [104.0], [80.0],
                         {"rank": 1, "sandbox_ms": 99.0, "job_ms": 106.0, "pred_rank_ms": 90.0, "events": events})
    b = _iterated_record("tp2", [200.0, 190.0, 210.0], [230.0], [196.0],
                         {"rank": 1, "sandbox_ms": 200.5, "job_ms": 195.0, "pred_rank_ms": 190.0, "events": events})
    (tmp_path / "r.json").write_text(json.dumps([a, b]))
    out = summarize([tmp_path / "r.json"])
    # dp2: truth 100 (90-110), final 104 (+4.0, inside), first pass 80 (-20.0, outside); rank 1's truth
    # 95 (85-105): sandbox 99 (+4.2), predicted rank 90 (-5.3); emulated job 106 vs 100 (+6.0)
    assert ("| dp2 | 104.00 | +4.0 | yes | 80.00 | -20.0 | no | 1 | 95.00 | 85.00-105.00 | 99.00 | +4.2 | 90.00 "
            "| -5.3 | 106.00 | +6.0 | 0.100/0.900 | 0.200/1.500 | +2.0 / -3.0 |") in out
    # tp2: truth 200, final 230 (+15.0, outside), first pass 196 (-2.0, inside); rank 1: 195 (185-205):
    # sandbox 200.5 (+2.8), predicted 190 (-2.6); job 195 (-2.5)
    assert "| tp2 | 230.00 | +15.0 | no | 196.00 | -2.0 | yes | 1 | 195.00 | 185.00-205.00 | 200.50 | +2.8 |" in out
    # first pass |errors| 20, 2 -> mean 11.0, 1 inside; final 4, 15 -> 9.5, 1 inside
    assert ("first pass (untimed slices): mean |error| 11.0 %, inside the truth's spread 1 of 2; final (timed "
            "slices) on the same configs: mean |error| 9.5 %, inside 1 of 2") in out
    # sandbox |errors| 4/95 = 4.21 %, 5.5/195 = 2.82 % -> 3.5 %; predicted rank 5/95 = 5.26, 5/195 = 2.56 -> 3.9 %;
    # emulated job 6 %, 2.5 % -> 4.2 %
    assert ("emulated sandbox (2 configs): its rank's iteration time mean |error| 3.5 % (the prediction for "
            "that rank: 3.9 %); emulated job mean |error| 4.2 %") in out


def test_a_failed_emulation_is_named_in_its_row(tmp_path):
    a = _iterated_record("dp2", [90.0, 110.0], [104.0], [80.0], {"error": "prism emulate ... exited 2: boom"})
    (tmp_path / "r.json").write_text(json.dumps([a]))
    out = summarize([tmp_path / "r.json"])
    assert "| dp2 | 104.00 | +4.0 | yes | 80.00 | -20.0 | no | not run: prism emulate ... exited 2: boom |" in out
    (back,) = read_json(tmp_path / "r.json")
    assert back.emulated == [{"error": "prism emulate ... exited 2: boom"}] and back.pred_untimed_ms == [80.0]


def test_the_source_digest_follows_the_prism_sources_not_the_git_metadata(tmp_path):
    from prism.bench.fidelity_table import scored_by, source_digest

    (tmp_path / "prism" / "sub").mkdir(parents=True)
    (tmp_path / "prism" / "a.py").write_text("x = 1\n")
    (tmp_path / "prism" / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "prism" / "notes.txt").write_text("not code")
    first = source_digest(tmp_path)
    assert len(first) == 16 and source_digest(tmp_path) == first
    (tmp_path / "prism" / "notes.txt").write_text("changed, not code")
    assert source_digest(tmp_path) == first
    (tmp_path / "prism" / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(tmp_path) != first
    assert scored_by()["digest"] == source_digest()
