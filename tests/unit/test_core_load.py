"""The fidelity bench's load on a slice run's other cores (`prism/bench/core_load.py`) and the run order of
`--slice-load` (`prism.bench.fidelity.prism_schedule`)."""

from __future__ import annotations

import os

from prism.bench import core_load
from prism.bench.fidelity import prism_schedule
from prism.bench.fidelity_table import Config, Result, from_record, to_record


def test_alternate_puts_one_loaded_and_one_plain_prism_run_between_every_two_truth_runs():
    runs = prism_schedule(4, 1, "alternate")
    assert [w for w, _, _ in runs] == ["truth", "prism", "prism"] * 3 + ["truth"]
    assert [i for w, i, _ in runs if w == "truth"] == [0, 1, 2, 3]
    assert [i for w, i, _ in runs if w == "prism"] == [0, 1, 2, 3, 4, 5]
    gaps = [[loaded for w, _, loaded in runs[k:k + 2]] for k in (1, 4, 7)]
    assert gaps == [[False, True], [True, False], [False, True]]   # the order swaps from gap to gap


def test_the_default_order_is_unchanged_and_model_loads_every_prism_run():
    assert prism_schedule(5, 1, "none") == [("truth", 0, False), ("prism", 0, False)] + [
        ("truth", i, False) for i in range(1, 5)]
    assert [loaded for w, _, loaded in prism_schedule(3, 2, "model") if w == "prism"] == [True, True]


def test_a_result_keeps_which_prism_runs_were_loaded():
    r = Result(Config("dp8", 8, ("--dp", "8"), 4), 4, truth_ms=[1.0], pred_ms=[1.0, 2.0], slice_load=[False, True])
    assert from_record(to_record(r)).slice_load == [False, True]
    assert "slice_load" not in to_record(Result(r.cfg, 4, truth_ms=[1.0], pred_ms=[1.0]))


def test_the_load_runs_at_sched_idle_on_its_core_and_stop_leaves_no_process():
    core = sorted(os.sched_getaffinity(0))[-1]
    load = core_load.CoreLoad([core])
    try:
        (proc,) = load.procs
        assert proc.poll() is None
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
        assert os.sched_getaffinity(proc.pid) == {core}
    finally:
        load.stop()
    assert proc.poll() is not None and load.procs == []
