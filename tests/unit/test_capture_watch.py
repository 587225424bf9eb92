"""The bench's capture watch: a capture that runs past its budget leaves a row saying how far it got, and is
stopped; one that ends in time leaves no failure (session 12's W=8192 host call returned no row at all)."""

import subprocess
import sys
import time
from types import SimpleNamespace

from prism.bench.capture_scale import _watch_capture, last_progress

LAYOUT = {4: (1, 1, 4, 1)}


def _program(tmp_path, body: str):
    log = tmp_path / "capture.log"
    err = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-c", body], stdout=subprocess.DEVNULL, stderr=err)
    return proc, log, err


def test_a_capture_over_its_budget_is_saved_with_its_last_progress_and_stopped(tmp_path):
    proc, log, err = _program(tmp_path, "import sys, time\n"
                              "print('capture: 3 of 4 ranks forked', file=sys.stderr, flush=True)\n"
                              "time.sleep(60)")
    saved = []
    start = time.monotonic()
    time.sleep(0.5)  # the program's line is written
    row = _watch_capture(proc, 4, 2, LAYOUT, start, 1.5, SimpleNamespace(peak=123), log, saved.append)
    err.close()
    assert proc.returncode is not None and proc.returncode != 0  # stopped, not waited out
    assert time.monotonic() - start < 20
    assert saved and saved[-1] == row
    assert row["failed_stage"] == "capture" and row["running"] == "capture"
    assert row["capture_progress"] == "capture: 3 of 4 ranks forked"
    assert row["pss_peak_so_far"] == 123 and row["elapsed_s"] >= 1.5
    assert "over the 2 s budget" in row["error"] and "3 of 4 ranks forked" in row["error"]


def test_a_capture_that_ends_in_time_leaves_no_failure(tmp_path):
    proc, log, err = _program(tmp_path, "pass")
    saved = []
    row = _watch_capture(proc, 4, 2, LAYOUT, time.monotonic(), 30.0, SimpleNamespace(peak=0), log, saved.append)
    err.close()
    assert proc.returncode == 0 and "failed_stage" not in row


def test_last_progress_reads_the_last_line_of_a_rewritten_or_missing_log(tmp_path):
    log = tmp_path / "l"
    assert last_progress(log) == ""
    log.write_text("a\rprogress 1/8\rprogress 2/8\n\n")
    assert last_progress(log) == "progress 2/8"
    log.write_text("[prism] capture 30 s: 3/8 ranks done\nmoe_gpt: rank 7 ...\n")
    assert last_progress(log) == "[prism] capture 30 s: 3/8 ranks done"  # the launcher's, not a rank's line
