"""The process that stands in for the virtual ranks: what the slice mode's replay server and the emulate
mode's worker share.

`VirtualRanks` holds the plan (`plan.load_plan`), the capture's payloads, one client of the job's store that
every virtual member shares (`PollingStore`: a blocking get would hold the client for all of them), the
gloo instances of its groups, and the replay threads: one per group (`_group`) and one per message channel
(`_channel`), which the mode defines. `run_to_end` runs them (and the timed replay's loop, when there is
one) and says on stderr what failed or what was still pending when stopped. `keep_until_exit` keeps an
object alive to the process's end: it ends with `os._exit`, since tearing gloo instances down takes seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from prism import job_paths
from prism.runtime import shm
from prism.runtime.replay.plan import Channel, ReplayError, ReplayPlan

PREFETCH = 4  # payloads loaded ahead of use, per replay thread
_KEPT: list = []
_END = object()


def keep_until_exit(obj) -> None:
    """Keep `obj` (a server, its gloo instances) alive until the process ends."""
    _KEPT.append(obj)


class PollingStore(dist.Store):
    """A store client shared by many members that rendezvous at once: a blocking get or wait would hold
    the client (and block every other member's set), so it polls `check` instead."""

    POLL_S = 0.002

    def __init__(self, base, lock: threading.Lock) -> None:
        super().__init__()
        self.base, self.lock = base, lock

    def _await(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.base.timeout).total_seconds()
        deadline = time.monotonic() + limit
        while True:
            with self.lock:
                if self.base.check(keys):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the store did not get keys {keys} within {limit:.0f} s")
            time.sleep(self.POLL_S)

    def set(self, key, value):
        with self.lock:
            self.base.set(key, value)

    def get(self, key):
        self._await([key])
        with self.lock:
            return self.base.get(key)

    def wait(self, keys, timeout=None):
        self._await(list(keys), timeout)

    def check(self, keys):
        with self.lock:
            return self.base.check(keys)

    def add(self, key, amount):
        with self.lock:
            return self.base.add(key, amount)

    def compare_set(self, key, expected, desired):
        with self.lock:
            return self.base.compare_set(key, expected, desired)

    def delete_key(self, key):
        with self.lock:
            return self.base.delete_key(key)

    def num_keys(self):
        with self.lock:
            return self.base.num_keys()


class VirtualRanks:
    """The virtual ranks of one run, in one process (see the module doc); a mode defines `_group(group)` and
    `_channel(channel)`, the replay of one group's collectives and of one channel's messages."""

    def __init__(self, plan: ReplayPlan, capture: Path, timeout: timedelta) -> None:
        self.plan = plan
        self.payloads = shm.PayloadStore(job_paths.payloads_dir(capture))
        self.timeout = timeout
        self.pgs: dict[str, dict[int, object]] = {}
        self.loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prism-replay-load")
        self.errors: list[str] = []
        self.state: dict[str, str] = {}  # thread -> what it is doing now (diagnosis)
        self.ops = 0
        self.messages = 0
        # one client of the job's store for every virtual member (each client costs a connection, and
        # connections to a TCPStore are slow to open by the dozen), shared without blocking (PollingStore)
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   wait_for_workers=False, timeout=timeout)
        self._store_lock = threading.Lock()
        self.built = list(plan.order)  # the groups whose members this process creates
        self._keep: list = []
        self.timed = None  # a clock.TimedReplay: virtual members issue at their calibrated times

    def shared_store(self) -> PollingStore:
        """A client of the job's store over the shared connection, kept as long as this process."""
        shared = PollingStore(self.store, self._store_lock)
        self._keep.append(shared)  # the Python object must outlive its use from C++
        return shared

    def _group(self, group: str) -> None:
        raise NotImplementedError

    def _channel(self, ch: Channel) -> None:
        raise NotImplementedError

    def _load(self, digest: str):
        try:
            return self.payloads.get(digest)
        except shm.CorruptPayload as exc:
            raise ReplayError(str(exc)) from None
        except FileNotFoundError:
            raise ReplayError(f"payload {digest} missing from {self.payloads.dir}") from None

    def _prefetched(self, items: list, load):
        """Yield (item, load(item)) in order, with up to PREFETCH loads running ahead."""
        ahead: deque = deque()
        it = iter(items)

        def fill() -> None:
            while len(ahead) <= PREFETCH:
                item = next(it, _END)
                if item is _END:
                    return
                ahead.append((item, self.loader.submit(load, item)))

        fill()
        while ahead:
            item, fut = ahead.popleft()
            fill()
            yield item, fut.result()

    def wait_for_group(self, group: str) -> bool:
        """Wait until the group's members exist (its thread creates them); False when a thread failed."""
        while group not in self.pgs:
            if self.errors:
                return False
            time.sleep(0.005)
        return True

    def run_to_end(self, threads: list[threading.Thread], t0_ns: int, stop: threading.Event, who: str) -> bool:
        """Start the timed replay's loop (when there is one) beside the replay `threads`, from the common
        start `t0_ns`, and wait for all of them. False, said on stderr (`who` names the process), when one
        of them failed or `stop` was set before everything was replayed."""
        if self.timed is not None:
            loop = threading.Thread(target=self._run, args=(self.timed.run, t0_ns, "timed replay"), daemon=True,
                                    name="prism-timed-replay")
            loop.start()
            threads.append(loop)
        while any(t.is_alive() for t in threads):
            if self.errors:
                break
            if stop.is_set():
                print(f"[prism] {who} stopped before it replayed everything; still waiting for: "
                      + "; ".join(self.pending()), file=sys.stderr, flush=True)
                if self.timed is not None:
                    self.timed.stop()
                return False
            for t in threads:
                t.join(0.05)
                if t.is_alive():
                    break
        if self.errors:
            print(f"[prism] {who} failed: " + "; ".join(self.errors), file=sys.stderr, flush=True)
            return False
        return True

    def _run(self, fn, arg, name: str) -> None:
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.errors.append(f"{name}: {type(exc).__name__}: {exc} (while {self.state.get(name, 'starting')})")

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._run, args=(self._group, g, f"group {g}"), daemon=True,
                                    name=f"prism-replay-g{g}") for g in self.built]
        threads += [threading.Thread(target=self._run, args=(self._channel, ch,
                                                             f"p2p {ch.src}->{ch.dst} group {ch.group} tag {ch.tag}"),
                                     daemon=True, name="prism-replay-p2p") for ch in self.plan.channels]
        for t in threads:
            t.start()
        return threads

    def pending(self) -> list[str]:
        return [f"{who}: {what}" for who, what in sorted(self.state.items()) if what != "done"]
