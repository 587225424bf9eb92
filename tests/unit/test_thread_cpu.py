"""`prism.runtime.thread_cpu`: CPU time of the process's threads by kind (Linux /proc)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from prism.runtime import thread_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task (Linux)")


def test_kind_drops_instance_numbers():
    assert thread_cpu.kind("prism-emu-g23_0") == "prism-emu-g"
    assert thread_cpu.kind("prism-emu-hold") == "prism-emu-hold"
    assert thread_cpu.kind("MainThread") == "MainThread"


def test_a_spinning_thread_is_charged_its_own_cpu_time():
    """Two threads of one kind spin until each used 0.2 s of its own CPU; they are still alive when read:
    their kind holds >= 0.4 s (less the clock's tick), and the main thread, which waited, far less."""
    stop, ready = threading.Event(), threading.Barrier(3)

    def spin():
        while time.thread_time() < 0.2:
            pass
        ready.wait()
        stop.wait()

    threads = [threading.Thread(target=spin, name=f"prism-test-g{i}_0") for i in (1, 2)]
    for t in threads:
        t.start()
    before = thread_cpu.by_thread().get("MainThread", 0.0)
    ready.wait()
    try:
        got = thread_cpu.by_thread()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert got["prism-test-g"] >= 0.4 - 0.03
    assert got["MainThread"] - before < 0.2
