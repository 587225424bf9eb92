"""Which clock an event's own duration comes from in calibration (`prism.calibrate.durations.own_ns`):
compute and markers the device clock (`device_ns`: on CUDA the GPU time between the event's boundaries,
from CUDA events; the host's CPU time of a CUDA compute segment only launched its kernels), waits the
host thread's CPU time (`cpu_ns`: on CUDA a wait's GPU span includes the host's blocking). On CPU the two
columns hold the same value, so nothing changes there. Hand-computed values."""

from __future__ import annotations

import numpy as np

from prism import graph
from prism.calibrate import stage
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_MARKER, K_WAIT
from prism.calibrate.durations import bare_graph, own_ns
from tests.unit.rawgen import RawJob


def test_own_ns_takes_waits_from_the_cpu_clock_and_the_rest_from_the_device_clock():
    kind = np.array([K_COMPUTE, K_MARKER, K_COLLECTIVE, K_WAIT, K_COMPUTE])
    device = np.array([9_000, 3, 1_000, 2_000_000, -1])
    cpu = np.array([150, 2, 900, 300, -1])
    assert own_ns(kind, device, cpu).tolist() == [9_000, 3, 1_000, 300, -1]


def test_bare_graph_on_cuda_clocks():
    """rank 0: compute (GPU 9000 ns, launched in 150 ns of CPU), an async all_reduce issued in 1000 ns, a
    wait that blocked the host 2 ms (its GPU span) but spent 300 ns of CPU besides, then a compute whose
    thread changed (cpu -1: its device time still counts)."""
    kind = np.array([K_COMPUTE, K_COLLECTIVE, K_WAIT, K_COMPUTE])
    comm = np.array([-1, 0, -1, -1])
    wait_op = np.array([-1, -1, 1, -1])
    device = np.array([9_000, 5, 2_000_000, 4_000])
    cpu = np.array([150, 5, 300, -1])
    t_start = np.array([0, 150, 1_150, 2_001_150])
    t_end = np.array([150, 1_150, 2_001_150, 2_001_200])
    t_complete = np.full(4, -1)
    dur, transfer = bare_graph(kind, comm, wait_op, own_ns(kind, device, cpu), t_start, t_end, t_complete, 1)
    assert dur.tolist() == [9_000, 1_000, 300, 4_000]
    assert transfer.tolist() == [2_001_150 - 150]  # the wait's end minus the (only) member's issue start


def test_the_stage_reads_both_clocks(tmp_path):
    job = RawJob(2, device="cuda")
    everyone = job.group("default_pg", [0, 1])
    for r in range(2):
        job.compute(r)
    works = job.collective(everyone, "all_reduce", 4096, is_async=True)
    for r in range(2):
        job.wait(r, works[r])
        job.marker(r, "iteration_end")
    for r in range(2):  # a CUDA rank: compute launched in 40 ns of CPU; the wait blocked 1 ms on the GPU clock
        for e in job.events[r]:
            if e["kind"] == "compute":
                e["cpu_ns"] = 40
            if e["kind"] == "wait":
                e["device_ns"] = 1_000_000
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    loaded = stage.load_graph(tmp_path)
    kinds = loaded.graph.kind
    own = loaded.columns["own_ns"]
    assert own[kinds == K_COMPUTE].tolist() == [5_000, 5_000]  # rawgen's compute: 5000 ns on the device
    assert own[kinds == K_WAIT].tolist() == [500, 500]  # rawgen's wait: 500 ns of CPU
    tables, _, _ = stage.calibrate(tmp_path)
    iters = tables["iterations"].to_pylist()
    # compute 5000, all_reduce issue 2000, wait 500 (the transfer, from the graph's own wait ends, is
    # at most what the waits measured on the host clock), marker 0: every rank's iteration >= 7500 ns and far
    # below the 1 ms the wait's GPU span would have added
    assert all(7_500 <= it["duration_ns"] < 100_000 for it in iters), iters
