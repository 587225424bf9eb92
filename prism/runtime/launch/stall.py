"""The launcher's progress watchdog: a run whose processes all stopped moving is named, then stopped.

The hang watchdog (`prism.runtime.watchdog`, capture's coordinator) names a job whose ranks wait on each other
in communication. A run can also stall outside it: its ranks asleep before their first process group, the
replay process waiting for ranks that never come, the zygote stuck in an import (issue 23: "a slice run of a
resumed pipeline hung 6 minutes once with an empty log"). So the launcher of the runs the pipeline starts
(capture, slice, emulate: `Mode.stall_watch`) watches its zygote's process tree: progress is CPU used by the
zygote, the ranks and the replay process (one of them using more than `BUSY_FRACTION` of a core over a poll: pollers and
the hang watchdog's threads use far less) or a change in the run's status folder (a rank's notes, a diagnosis). After
`PRISM_STALL_TIMEOUT` seconds (default 300; 0: off) without either it prints what each process waits in (its
kernel wait channel, and its Python stacks: every process of the run dumps them on SIGUSR1, `faulthandler`);
after as long again, it stops the run (the zygote stops its ranks) and the launcher exits with 86.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from prism import settings

BUSY_FRACTION = 0.2  # a watched process used more CPU than this share of one core over a poll: progress (a
#                     replay process polling its store uses ~7 %, a rank that computes ~100 %)
DUMP_SIGNAL = signal.SIGUSR1
PIDS = "pids.json"  # in the status folder: {pid: rank} (the zygote writes it once it forked them; -1: replay)
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def enable_dumps() -> None:
    """In a process of the run (zygote, rank, replay): dump every thread's Python stack on SIGUSR1."""
    try:
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass


def write_pids(status_dir: str, children: dict[int, int]) -> None:
    """The zygote's children (pid -> rank; the replay process: a negative id), for the watchdog's report."""
    tmp = Path(status_dir, f".{PIDS}.tmp")
    tmp.write_text(json.dumps({str(pid): rank for pid, rank in children.items()}))
    tmp.replace(Path(status_dir, PIDS))


def timeout_s() -> float:
    return max(0.0, settings.STALL_TIMEOUT.get())


def _stat(pid: int) -> tuple[int, float, str] | None:
    """(parent pid, CPU seconds used, state letter) of `pid`, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S, fields[0]


def tree(root: int) -> dict[int, tuple[int, float, str]]:
    """`root` and the processes under it: pid -> (ppid, cpu_s, state)."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                stats[int(entry.name)] = st
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [root] if root in stats else []
    while todo:
        pid = todo.pop()
        out[pid] = stats[pid]
        todo += kids.get(pid, [])
    return out


def _status_mtime(folder: Path) -> float:
    newest = 0.0
    try:
        for entry in os.scandir(folder):
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except OSError:
                continue
    except OSError:
        pass
    return newest


class StallWatch:
    """Watches the process tree of `zygote` (a Popen) for the run whose status folder is `status_dir`."""

    def __init__(self, zygote, status_dir: Path, timeout: float) -> None:
        self.zygote, self.status_dir, self.timeout = zygote, Path(status_dir), timeout
        self.poll_s = min(5.0, max(0.2, timeout / 5))
        self.stopped_run = False
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prism-stall-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.done.set()
        self._thread.join(timeout=2)

    def _names(self) -> dict[int, str]:
        try:
            pids = json.loads((self.status_dir / PIDS).read_text())
        except (OSError, ValueError):
            pids = {}
        return {int(p): "the replay process" if int(r) < 0 else f"rank {r}" for p, r in pids.items()}

    def _run(self) -> None:
        last_cpu, last_mtime = None, _status_mtime(self.status_dir)
        since = time.monotonic()
        reported = False
        settle = 0  # polls after a report whose CPU is the stack dumps', not progress
        while not self.done.wait(self.poll_s):
            if self.zygote.poll() is not None:
                return
            procs = tree(self.zygote.pid)
            cpu = {pid: c for pid, (_, c, _) in procs.items()}
            mtime = _status_mtime(self.status_dir)
            now = time.monotonic()
            used = max((c - last_cpu.get(pid, c) for pid, c in cpu.items()), default=0.0) if last_cpu else 0.0
            busy = used > BUSY_FRACTION * self.poll_s and not settle
            settle = max(0, settle - 1)
            if busy or mtime != last_mtime or last_cpu is None:
                since, reported = now, False
            last_cpu, last_mtime = cpu, mtime
            idle = now - since
            if idle >= 2 * self.timeout:
                print(f"[prism] run stopped: no progress for {idle:.0f} s (its processes used no CPU and wrote "
                      f"nothing; {settings.STALL_TIMEOUT.name}={self.timeout:g}); what they waited in is above",
                      file=sys.stderr, flush=True)
                self.stopped_run = True
                self.zygote.send_signal(signal.SIGTERM)  # the zygote stops its ranks
                return
            if idle >= self.timeout and not reported:
                reported, settle = True, 2
                self._report(procs, idle)

    def _report(self, procs: dict, idle: float) -> None:
        names = self._names()
        lines = [f"[prism] no progress for {idle:.0f} s: no process of the run used CPU or wrote a note "
                 f"({settings.STALL_TIMEOUT.name}={self.timeout:g}; stopped after {2 * self.timeout:g} s). "
                 "What each waits in (its Python stacks follow):"]
        for pid, (_, _, state) in sorted(procs.items()):
            try:
                wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "?"
            except OSError:
                wchan = "?"
            who = "the zygote" if pid == self.zygote.pid else names.get(pid, "a helper process")
            lines.append(f"  {who} (pid {pid}): state {state}, in {wchan}")
        print("\n".join(lines), file=sys.stderr, flush=True)
        for pid in [p for p in sorted(procs) if p in names or p == self.zygote.pid]:  # only those that dump on it
            try:
                os.kill(pid, DUMP_SIGNAL)
            except OSError:
                pass
