"""Mode `emulate`: the common start t0 of the sandbox ranks and the replay worker.

Every party (each sandbox rank at its first process group, the worker once its timed replay is ready) adds
itself to a counter on the job's store; the last one stamps t0 = its host monotonic clock (CLOCK_MONOTONIC,
shared by every process of the host) and the others read it. The sandbox ranks' timelines start at t0
(`Recorder.resync`) and the virtual ranks' clock counts from it (`replay.clock`), so both are on one clock.

Over hosts the monotonic clocks of two machines differ: the key holds t0 on host 0's clock, and each process
converts with its host's offset (`PRISM_CLOCK_OFFSET_NS`: its clock minus host 0's, measured by the launchers,
`launch.hosts.sync_clocks`; 0 on one host), so t0 is one instant on every host, read on each host's clock.
"""

from __future__ import annotations

import time
from datetime import timedelta

from prism import settings
from typing import Callable

T0_KEY = "prism-emu/t0"
T0_COUNT = "prism-emu/t0/arrived"


def common_start(store, parties: int, timeout: timedelta = timedelta(minutes=10),
                 stopped: Callable[[], bool] = lambda: False, offset: int | None = None) -> int:
    """A barrier of `parties` processes on the job's store; returns t0 (host monotonic ns): the time the
    last one arrived (it stamps the key; the others read it). `offset`: this host's clock minus host 0's
    (default PRISM_CLOCK_OFFSET_NS)."""
    offset = settings.CLOCK_OFFSET_NS.get() if offset is None else offset
    if store.add(T0_COUNT, 1) == parties:
        t0 = time.monotonic_ns()
        store.set(T0_KEY, str(t0 - offset))
        return t0
    deadline = time.monotonic() + timeout.total_seconds()
    while not store.check([T0_KEY]):
        if stopped():
            raise InterruptedError("stopped while waiting for the common start")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the common start: not every one of {parties} parties (sandbox ranks and the "
                               f"replay worker) arrived within {timeout.total_seconds():.0f} s")
        time.sleep(0.001)
    return int(store.get(T0_KEY)) + offset


def to_local_clock(host0_ns: int) -> int:
    """A time the replay worker sent (host 0's monotonic ns; 0: none) on this host's clock."""
    return host0_ns + settings.CLOCK_OFFSET_NS.get() if host0_ns else 0
