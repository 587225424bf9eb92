"""CPU time of this process's threads, by what they are (Linux: ``/proc/self/task/<tid>/stat``).

An emulated sandbox rank runs the program on its main thread beside prism's own Python threads (a group's
protocol thread `prism-emu-g<group>`, the hold timer `prism-emu-hold`) and the backend's C++ threads
(gloo's). A Python thread's CPU time is, within a few lock hand-overs, time it held the GIL, which the
program's own thread could not have: `by_thread` is the evidence for or against the GIL hypothesis of a
slow sandbox (docs/fidelity.md "local, session 8"). Threads are named by their Python name with a trailing
group or pool number dropped (``prism-emu-g`` for all group threads); threads Python did not start by
their OS name (``comm``) in brackets.
"""

from __future__ import annotations

import os
import re
import threading

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_s(tid: int) -> float | None:
    """utime + stime (s) of task `tid` of this process; None where it cannot be read."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 -> index 0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def kind(name: str) -> str:
    """A Python thread's name without its trailing instance numbers: ``prism-emu-g23_0`` -> ``prism-emu-g``."""
    return re.sub(r"[\d_]+$", "", name) or name


def _runq_wait_s(tid: int) -> float | None:
    """Seconds task `tid` of this process was runnable but waited for a CPU (``/proc/.../schedstat``'s second
    field: the scheduler's run-queue delay); None where it cannot be read (no schedstats)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _per_thread(read) -> dict[str, float]:
    if not os.path.isdir("/proc/self/task"):
        return {}
    named = {t.native_id: kind(t.name) for t in threading.enumerate() if t.native_id is not None}
    out: dict[str, float] = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        value = read(tid)
        if value is None:
            continue
        # the main thread is the task whose id is the process's (a forked rank's Python keeps its parent's id)
        name = "MainThread" if tid == os.getpid() else named.get(tid) or f"[{_comm(tid)}]"
        out[name] = round(out.get(name, 0.0) + value, 3)
    return out


def by_thread() -> dict[str, float]:
    """CPU seconds per kind of thread ({} where /proc is missing): Python threads by `kind` of their name
    (the main thread, the task whose id is the process id, is ``MainThread``), the others as ``[comm]``."""
    return _per_thread(_cpu_s)


def runq_wait_by_thread() -> dict[str, float]:
    """Seconds per kind of thread (named as `by_thread`) spent runnable but waiting for a CPU: a thread woken by
    a message it must pass on (a gloo ring's hop) and not run at once delays the whole chain by that much."""
    return _per_thread(_runq_wait_s)
