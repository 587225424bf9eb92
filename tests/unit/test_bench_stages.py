"""`prism bench capture`: a stage that fails keeps the numbers of the stages before it (issue 25's host call lost
whole rows when only its report failed: the host lacked plotly)."""

import json
import sys

from prism.bench import scale_slices, scale_tables
from prism.bench.size_stages import Stages, extrapolated_s, one_line, write_json

PY = sys.executable


def test_a_late_stage_failing_keeps_the_earlier_stages_and_says_which_failed(tmp_path, capsys):
    row = {"W": 16, "layout": "tp2·pp2·dp4·ep2", "wall_s": 12.5, "pss_peak": 2**30}
    saved = []
    stages = Stages(row, lambda: 60.0, lambda r: saved.append(json.loads(json.dumps(r))))
    marker = tmp_path / "ran"
    assert stages.run("graph", [PY, "-c", "pass"], "graph at W=16")
    assert stages.run("plan", [PY, "-c", "pass"], "plan at W=16")
    assert not stages.run("summary", [PY, "-c", "import sys; print('Traceback ...', file=sys.stderr); "
                                      "raise SystemExit('ModuleNotFoundError: no plotly')"], "summary")
    # a stage after the failed one is not run
    assert not stages.run("report", [PY, "-c", f"open({str(marker)!r}, 'w')"], "report")
    assert not marker.exists()
    assert row["graph_s"] > 0 and row["graph_rss"] > 0 and row["plan_s"] > 0
    assert "summary_s" not in row and "report_s" not in row
    assert row["failed_stage"] == "summary"
    assert row["error"] == "summary failed (1): ModuleNotFoundError: no plotly"
    assert "\n" not in row["error"]
    # every stage's end was saved: the last save holds the failure and the earlier numbers
    assert [("graph_s" in s, "plan_s" in s, "failed_stage" in s) for s in saved] == [
        (True, False, False), (True, True, False), (True, True, True)]
    scale_tables.print_tables([row])
    out = capsys.readouterr().out
    assert "FAILED" in out and "\n      summary failed (1): ModuleNotFoundError: no plotly" in out
    cells = scale_tables.stage_cells(row)
    assert cells[0].strip() == "12.5/  1.00" and cells[1] != "-" and cells[2] != "-"
    assert cells[1 + scale_tables.STAGES.index("summary")] == "FAILED"
    assert cells[1 + scale_tables.STAGES.index("report")] == "-"


def test_slice_runs_that_fail_keep_the_ones_that_ran(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    job = tmp_path / "job"
    (job / "slices").mkdir(parents=True)
    pq.write_table(pa.table({"slice": [0, 1, 2], "measured": [True, True, True]}), job / "slices" / "plan.parquet")
    row = {"W": 48, "layout": "x", "wall_s": 1.0, "pss_peak": 0}
    stages = Stages(row, lambda: 30.0)
    # `prism.slices.run` on a job with no capture fails at once: slice 0 is the failing stage
    scale_slices.run(job, stages)
    assert row["slice_runs"] == 3 and row["slice_runs_done"] == 0
    assert row["failed_stage"] == "slice run 0" and "slices_run_s" in row
    assert "from_slices_s" not in row and "calibrate_s" not in row
    assert "FAILED" in scale_tables.stage_cells(row)[1 + scale_tables.STAGES.index("slices")]


def test_json_is_replaced_whole(tmp_path):
    path = tmp_path / "rows.json"
    write_json(path, [{"W": 16}])
    write_json(path, [{"W": 16}, {"W": 64, "failed_stage": "report"}])
    assert json.loads(path.read_text())[1]["failed_stage"] == "report"
    assert not (tmp_path / "rows.json.tmp").exists()


def test_one_line_keeps_the_first_and_last_lines():
    assert one_line(RuntimeError("report failed (1):\nTraceback\n  File x\nModuleNotFoundError: plotly")) == \
        "report failed (1): ModuleNotFoundError: plotly"


def _done(w, total):
    return {"W": w, "wall_s": total}


def test_a_size_is_extrapolated_from_a_fixed_part_and_one_per_rank():
    # W=16 took 60 s, W=128 70 s: ~54 s fixed + 0.089 s a rank -> W=1024 ~150 s (by W alone it would be 3,840 s)
    guess, source = extrapolated_s(1024, [_done(16, 60.0), _done(128, 70.0)])
    assert abs(guess - (60 + 10 / 112 * (1024 - 16))) < 1e-6 and source == "from W=16 and W=128"
    assert extrapolated_s(128, [_done(16, 60.0)]) is None  # one small size: nothing to go by
    assert extrapolated_s(2048, [_done(1024, 100.0)])[0] == 200.0
    # a size whose stage failed (or was skipped) is not a measure of a whole size
    assert extrapolated_s(2048, [_done(16, 60.0), {"W": 128, "wall_s": 5.0, "failed_stage": "graph"}]) is None


def test_the_capture_table_says_where_the_capture_went(capsys):
    row = {"W": 64, "layout": "tp2·pp2·dp16·ep2", "wall_s": 12.9, "pss_peak": 2**30, "cgroup_peak": None,
           "rank_private_mib_median": 14.0, "rank_private_mib_max": 15.0, "switches": 10, "payload_bytes": 0,
           "payload_files": 0, "fork_s": 0.5, "fork_helpers": 0, "coordinator_cpu_s": 0.7,
           "coordinator_wall_s": 9.7, "ranks_cpu_s": 7.0, "setup_cpu_s": 1.2, "slot_held_s": 18.4,
           "phases_s": {"warm": 2.4, "fork": 0.5, "hello": 0.0, "setup": 5.8, "steps": 3.8, "exits": 0.4,
                        "close": None}}
    args = type("Args", (), {"devices": 2, "steps": 2, "no_payloads": False, "no_warmup": False})
    scale_tables.print_table([row], args)
    out = capsys.readouterr().out
    assert ("phases: warm 2.4 fork 0.5 hello 0.0 setup 5.8 steps 3.8 exits 0.4, set-up CPU 1.2 s, "
            "slots held 18.4 s") in out
    del row["phases_s"]  # a row of an older capture: the line as before
    scale_tables.print_table([row], args)
    assert "phases" not in capsys.readouterr().out


def test_the_tables_of_a_json_file_show_the_phases(tmp_path):
    """`python -m prism.bench.scale_tables FILE` (the device script's last step) prints the capture's phases."""
    import subprocess

    row = {"W": 16, "P": 2, "layout": "tp2·pp2·dp4·ep2", "wall_s": 18.3, "pss_peak": 2**29, "cgroup_peak": None,
           "rank_private_mib_median": 14.2, "rank_private_mib_max": 14.4, "switches": 554, "payload_bytes": 0,
           "payload_files": 0, "fork_s": 0.25, "fork_helpers": 0, "coordinator_cpu_s": 0.2,
           "coordinator_wall_s": 3.2, "ranks_cpu_s": 2.6, "setup_cpu_s": 0.3, "slot_held_s": 6.4,
           "phases_s": {"warm": 4.9, "fork": 0.25, "setup": 0.4, "steps": 2.8}}
    rows = tmp_path / "w16.json"
    rows.write_text(json.dumps([row]))
    proc = subprocess.run([PY, "-m", "prism.bench.scale_tables", str(rows)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "phases: warm 4.9 fork 0.2 setup 0.4 steps 2.8, set-up CPU 0.3 s, slots held 6.4 s" in proc.stdout
