"""The emulate stage's pieces on hand-made inputs: SPEC resolution, the substituted sweep, the what-if."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prism.calibrate import substitute
from prism.job import JobGraph
from prism.calibrate.synthetic import from_programs
from prism.emulate.sandbox import SandboxError, resolve


def ranks_table(tp=2, pp=2, dp=2, ep=None) -> pa.Table:
    """Rank order TP fastest, then DP, then PP (the reference workload's)."""
    rows = []
    for r in range(tp * pp * dp):
        t, d, p = r % tp, (r // tp) % dp, r // (tp * dp)
        rows.append({"rank": r, "tp": t, "pp": p, "dp": d, "ep": -1 if ep is None else d % ep})
    return pa.Table.from_pylist(rows)


@pytest.mark.parametrize("spec, want", [
    ("3,5", [3, 5]),
    ("5, 3,5", [3, 5]),
    ("pp=last,tp=0,dp=0", [4]),
    ("pp=last", [4, 5, 6, 7]),
    ("pp=first,tp=1,dp=last;pp=1,dp=1,tp=1", [3, 7]),
    ("pp=0,tp=1;6", [1, 3, 6]),
    (None, [4]),
    ("  ", [4]),
])
def test_sandbox_spec(spec, want):
    assert resolve(spec, ranks_table()) == want


def test_default_without_pipeline_is_rank_0():
    assert resolve(None, ranks_table(tp=2, pp=1, dp=2)) == [0]


@pytest.mark.parametrize("spec, words", [
    ("8", ["rank 8 is out of range", "8 ranks (0..7)"]),
    ("-1", ["rank -1 is out of range"]),
    ("pp=2", ["no pp=2", "[0, 1]"]),
    ("ep=0", ["no ep dimension", "tp in [0, 1], pp in [0, 1], dp in [0, 1]"]),
    ("xx=1", ["'xx=1' is not a coordinate", "tp=N|first|last"]),
    ("pp=mid", ["a number, first or last"]),
    ("three", ["neither a rank number nor a coordinate"]),
    (",", ["no rank given"]),
])
def test_sandbox_spec_errors(spec, words):
    with pytest.raises(SandboxError) as err:
        resolve(spec, ranks_table())
    for w in words:
        assert w in str(err.value)


def job_of(programs, transfer=None, markers=None) -> JobGraph:
    """A JobGraph around a hand-written graph; `markers` names marker events by (rank, index)."""
    syn = from_programs(programs, transfer)
    g = syn.graph
    n = g.n_events
    rank = np.repeat(np.arange(g.n_ranks), np.diff(g.rank_ptr)).astype(np.int32)
    names = ["", "fwd_end", "other"]
    g.op_names = names
    g.op_code = np.zeros(n, dtype=np.int32)
    for (r, i), name in (markers or {}).items():
        g.op_code[g.rank_ptr[r] + i] = names.index(name)
    job = JobGraph(g, np.arange(n), rank, np.arange(n) - g.rank_ptr[rank], np.zeros(n, np.int32),
                   np.zeros(n, bool), np.arange(g.n_comms), {})
    return job, syn.durations, syn.transfer


def test_substituted_sweep_delays_what_depends_on_the_sandbox():
    programs = [
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 0), ("compute", 5)],
        [("compute", 20), ("coll", "A", 1), ("wait", 1, 0), ("compute", 5)],
    ]
    job, dur, xfer = job_of(programs, {"A": 3})
    base = substitute.sweep(job, dur, xfer)
    assert base.end_ns.tolist() == [10, 11, 23, 28, 20, 21, 23, 28]
    # rank 0 measured: compute 30 (its device time), the all-reduce issued in 2 ns (its span), the wait's own
    # work 1 ns, the last compute 4; the -1 columns are what the measurement lacks
    rows = np.array([0, 1, 2, 3])
    dev = np.array([30, -1, 1, 4])
    t_start = np.array([500, 530, 532, 600])
    t_end = np.array([530, 532, 600, 604])
    new = substitute.substitute_measured(job, dur, rows, dev, t_start, t_end, np.full(4, -1))
    assert new.tolist() == [30, 2, 1, 4, 20, 1, 0, 5]
    assert dur.tolist() == [10, 1, 0, 5, 20, 1, 0, 5]  # the calibrated ones are left alone
    t = substitute.sweep(job, new, xfer)
    # rank 0: 0-30, issue 30-32, wait until max(32, 30+3) + its own 1 = 34, 34-38; rank 1 waits for rank 0's
    # arrival (completion 33, own 0)
    assert t.end_ns.tolist() == [30, 32, 34, 38, 20, 21, 33, 38]


def test_a_measured_compute_takes_the_longer_of_its_span_and_its_device_time():
    """The calibration takes a slice run's compute by the measured-run rule (`durations.measured_run`: the
    longer of the wall span and the device time); the sandbox's measured compute must be substituted by the
    same rule, or the emulated job's "program" runs short of the prediction by the sandbox's wall/CPU (on CPU
    the device time is the thread's CPU time: session 19, 1.02-1.10x) with the program unchanged."""
    programs = [
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 0), ("compute", 5)],
        [("compute", 20), ("coll", "A", 1), ("wait", 1, 0), ("compute", 5)],
    ]
    job, dur, xfer = job_of(programs, {"A": 3})
    rows = np.array([0, 1, 2, 3])
    # compute 0: CPU 30 in a span of 36 (descheduled 6); compute 3: device 9 in a span of 4 (CUDA: the GPU's
    # time, past the launch's host span); the wait's own CPU 1 within its span of 68
    dev = np.array([30, -1, 1, 9])
    t_start = np.array([500, 536, 538, 606])
    t_end = np.array([536, 538, 606, 610])
    new = substitute.substitute_measured(job, dur, rows, dev, t_start, t_end, np.full(4, -1))
    assert new.tolist() == [36, 2, 1, 9, 20, 1, 0, 5]
    # a calibration of the bare graph (no slice runs) took compute by its device time: the sandbox's the same
    bare = substitute.substitute_measured(job, dur, rows, dev, t_start, t_end, np.full(4, -1), spent=False)
    assert bare.tolist() == [30, 2, 1, 9, 20, 1, 0, 5]
    assert substitute.measured_by_slices("slice runs (slices/durations.parquet, ...)")
    assert not substitute.measured_by_slices("bare graph (no slice runs)")
    t = substitute.sweep(job, new, xfer)
    # rank 0 arrives at 36: completion 39; its wait ends at 39 + its own 1; rank 1 waits until 39
    assert t.end_ns.tolist() == [36, 38, 40, 49, 20, 21, 39, 44]


def test_a_measured_marker_takes_its_span_as_the_calibration_does():
    """A marker whose thread was off the CPU inside it (session 19: a bwd_end 5.8 ms wall, 0.05 ms CPU) is spent
    by its rank; the calibration takes the slices' markers by their span (`durations.spent_span`), so the
    sandbox's too."""
    programs = [[("compute", 10), ("marker", 0), ("compute", 5)], [("compute", 10), ("marker", 0), ("compute", 5)]]
    job, dur, _ = job_of(programs, markers={(0, 1): "other", (1, 1): "other"})
    rows = np.array([0, 1, 2])
    new = substitute.substitute_measured(job, dur, rows, np.array([10, 1, 5]), np.array([0, 10, 17]),
                                         np.array([10, 17, 22]), np.full(3, -1))
    assert new[:3].tolist() == [10, 7, 5]


def test_lengthen_after_marker():
    programs = [[("marker", 0), ("compute", 5), ("marker", 0), ("marker", 0), ("compute", 7), ("compute", 1)],
                [("compute", 2), ("marker", 0), ("compute", 3)]]
    job, dur, xfer = job_of(programs, markers={(0, 0): "fwd_end", (0, 2): "fwd_end", (0, 3): "other",
                                                  (1, 1): "fwd_end"})
    out = substitute.lengthen_after_marker(job, dur, rank=0, extra_ns=100)
    assert out.tolist() == [0, 105, 0, 0, 107, 1, 2, 0, 3]
    out = substitute.lengthen_after_marker(job, dur, rank=1, extra_ns=100)
    assert out.tolist() == [0, 5, 0, 0, 7, 1, 2, 0, 103]
