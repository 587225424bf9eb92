"""A group's exchanges, one at a time in issue order: on the group's own thread, or on the thread that
waits for one before that thread got to it.

An emulated sandbox rank runs a collective's exchange (the pruned protocol) off the program's thread, so
that an async op stays async (`emulation.EmulateTransport._collective`). But most ops are waited on at
once (a MoE layer's all-to-all, a TP all-reduce): handing such an op to the group's thread and back costs
two thread wake-ups and GIL hand-overs per op, and the group thread's Python work competes for the GIL
with the program's, which a real backend (gloo's C++ threads) does not. `run_through(job)` lets the
waiting thread run the exchanges itself: every exchange still issued before it and not started, then its
own, in issue order, under the one lock that also serializes the group thread. So the order on the wire is the issue order
either way and the results are the same; only who runs an exchange, and when it starts, changes.
Opt-in (`PRISM_EMU_INLINE=1`, `emulation.INLINE`): on the 2-core box it moved the protocol threads' CPU
time to the program's thread (0.12 -> 0.01-0.02 s a run) without a measurable change of the sandbox's
iteration time; whether it helps where the GIL, not the CPU, is contended (the 16-core host) is untested.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


class GroupRunner:
    def __init__(self, name: str) -> None:
        self._pending: deque[Callable[[], None]] = deque()  # issued, not started (issue order)
        self._queue_lock = threading.Lock()
        self._order = threading.Lock()  # held while one exchange runs
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.inline = 0  # exchanges run by a waiting thread

    def submit(self, job: Callable[[], None]) -> None:
        """Issue `job` (it must not raise: it reports its own errors); the group's thread runs it in turn
        unless a waiting thread gets there first (`run_through`)."""
        with self._queue_lock:
            self._pending.append(job)
        self._thread.submit(self._next)

    def _next(self) -> None:
        with self._order:
            with self._queue_lock:
                if not self._pending:
                    return  # a waiting thread ran it
                job = self._pending.popleft()
            job()

    def run_through(self, job: Callable[[], None]) -> None:
        """Run, on this thread, every exchange issued up to `job` that has not started, `job` last; return
        at once if `job` already started or ran elsewhere (the caller then waits for it as before)."""
        with self._queue_lock:
            if job not in self._pending:
                return
        with self._order:
            while True:
                with self._queue_lock:
                    if job not in self._pending:
                        return  # the group's thread took it while this one waited for the lock
                    nxt = self._pending.popleft()
                self.inline += 1
                nxt()
                if nxt is job:
                    return
