"""The fidelity bench's load on a slice run's other cores (`prism/bench/core_load.py`) and the run order of
`--slice-load` (`prism.bench.fidelity.prism_schedule`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from prism.bench import core_load
from prism.bench.fidelity import prism_schedule
from prism.bench.fidelity_table import Config, Result, from_record, to_record


def test_alternate_puts_one_loaded_and_one_plain_prism_run_between_every_two_truth_runs():
    runs = prism_schedule(4, 1, "mirror", alternate=True)
    assert [w for w, _, _ in runs] == ["truth", "prism", "prism"] * 3 + ["truth"]
    assert [i for w, i, _ in runs if w == "truth"] == [0, 1, 2, 3]
    assert [i for w, i, _ in runs if w == "prism"] == [0, 1, 2, 3, 4, 5]
    gaps = [[load for _, _, load in runs[k:k + 2]] for k in (1, 4, 7)]
    assert gaps == [["none", "mirror"], ["mirror", "none"], ["none", "mirror"]]   # the order swaps gap to gap


def test_the_default_order_is_unchanged_and_a_load_applies_to_every_prism_run():
    assert prism_schedule(5, 1, "none") == [("truth", 0, "none"), ("prism", 0, "none")] + [
        ("truth", i, "none") for i in range(1, 5)]
    assert [load for w, _, load in prism_schedule(3, 2, "full") if w == "prism"] == ["full", "full"]


def test_a_result_keeps_which_prism_runs_were_loaded():
    r = Result(Config("dp8", 8, ("--dp", "8"), 4), 4, truth_ms=[1.0], pred_ms=[1.0, 2.0],
               variant=["none", "mirror"])
    assert from_record(to_record(r)).variant == ["none", "mirror"]
    rec = {k: v for k, v in to_record(r).items() if k != "variant"} | {"slice_load": [False, True]}
    # (as session 18's first call wrote it: the full load)
    assert from_record(rec).variant == ["none", "full"]
    assert "variant" not in to_record(Result(r.cfg, 4, truth_ms=[1.0], pred_ms=[1.0]))


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


def test_a_mirror_computes_while_the_mirrored_core_runs_and_sleeps_while_it_idles():
    """A thread pinned to one core busy 0.4 s, then asleep 0.8 s: the mirror on another core uses about 0.4 s
    of CPU over that window, well under the window's 1.2 s and well over its idle polling."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    src, dst = cores[0], cores[1]
    worker = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        f"os.sched_setaffinity(0, {{{src}}})\n"
        "sys.stdin.readline()\n"
        "end = time.monotonic() + 0.4\n"
        "while time.monotonic() < end: pass\n"
        "time.sleep(0.8)\n")], stdin=subprocess.PIPE)
    try:
        time.sleep(0.3)   # the worker has pinned itself
        load = core_load.CoreLoad([dst], idle=False, mirror=[src])
        try:
            (proc,) = load.procs
            time.sleep(core_load.REFIND_S + 0.2)   # it has found the worker's thread
            before = _cpu_s(proc.pid)
            worker.stdin.write(b"go\n")
            worker.stdin.flush()
            worker.wait(10)
            used = _cpu_s(proc.pid) - before
        finally:
            load.stop()
    finally:
        worker.kill()
        worker.wait()
    assert 0.25 < used < 0.75, used


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_alternate_without_a_load_is_refused_with_the_fix(capsys):
    from prism.bench import fidelity

    assert fidelity.main(["--alternate", "--configs", "dp2"]) == 2
    assert "--slice-load full|mirror, --plan-keep DESC and/or --plan-rule RULE" in capsys.readouterr().err


def test_a_variant_label_names_its_options_and_gives_them_back():
    from prism.bench.fidelity import variant_label, variant_options

    assert variant_label("none", "") == "none" and variant_options("none") == ("none", "", "")
    assert variant_label("mirror", "tp") == "mirror+keep=tp"
    assert variant_options("mirror+keep=tp") == ("mirror", "tp", "")
    assert variant_options(variant_label("none", "tp,ep")) == ("none", "tp,ep", "")
    assert variant_label("none", "", "bytes") == "rule=bytes"
    assert variant_options(variant_label("full", "tp", "bytes")) == ("full", "tp", "bytes")
