"""Mode `emulate`, rank side: the works a sandbox rank's emulated collectives answer, and the transfer hold.

The transfer hold (`replay.clock`'s module doc): a real collective completes, for the program, no earlier
than its *floor* (host monotonic ns): its calibrated completion for the arrivals known. The hold delays
only what the program sees (`wait`, `is_completed`, the future); it never holds the thread that runs the
group's exchanges: a group's collectives are exchanged one after the other on that thread as soon as
their participants arrive, and each is then held to its own floor apart. Holding the thread (as before)
put every later collective of the group behind the earlier one's hold: a burst of async all-reduces whose
calibrated completions bunch at the end of the backward pass (DDP's buckets, their waits all there)
completed one exchange apart after that time instead of together (dp8-ep4's DP and EDP all-reduces: 11 ms
an iteration past the model, device-10a in `docs/fidelity.md`).

- `EmuWork`: a collective run by the pruned protocol on the group's thread; the thread sets its floor
  and completes its inner future; `wait` holds on the caller's thread, the future (DDP's path) is
  completed at the floor by `TIMER`.
- `NativeWork`: a native gloo op of an all-sandbox group (`native_group`); it can be held the same way,
  but `EmulateTransport` gives it no floor (the job's own op is not held: `EmulateTransport._native`).
- `SourceWork`: a recv's work that says who sent.
- `LocalSend`: a send the model completes locally (`prism.clock_rule`: a wait on a send is its own time
  only), while gloo's send is a rendezvous, complete only once the receiver posted its recv: the data goes
  out on a sender thread of the transport (`SENDS`), the program's work is complete at once.
`STATS` are the rank's numbers (`write_rank_stats`), shared with `emulate.transport` and `emulate.worker`.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from pathlib import Path
from typing import Callable

import torch
from torch._C._distributed_c10d import Work

from prism import settings
from prism.runtime import thread_cpu
from prism.runtime.work_parts import Forwarding, OwnResult

STATS = {"groups": 0, "communicators": 0, "bytes_sent": 0, "bytes_received": 0, "collectives": 0, "messages": 0,
          "framing_bytes": 0, "collective_messages": 0, "transfer_holds": 0, "transfer_hold_s": 0.0}
STATS_LOCK = threading.Lock()
# where a protocol collective's time goes on the rank (s, summed; `write_rank_stats` "diagnostics"):
# issue -> its group thread starts the exchange (queue), the exchange itself, and, for a work already
# waited on when the exchange ended, that end -> the waiting thread runs again (wake; holds excluded);
# how far past the op's floor its data, then the floor message, came in (where the group has other
# sandbox members, waiting for them counts too: their arrival is no part of the floor); and for every
# hold (`hold_until`), how far past the floor the sleeping thread ran again
HOPS = {"protocol_ops": 0, "queue_s": 0.0, "exchange_s": 0.0, "waited_ops": 0, "wake_s": 0.0,
         "data_past_floor_s": 0.0, "floor_msg_past_floor_s": 0.0, "held_ops": 0, "hold_overshoot_s": 0.0,
         "by_op": {}}  # "<op> group <g>": [ops, queue s, exchange-to-data s, data past the floor s]


def _count_hold(delay_ns: int) -> None:
    with STATS_LOCK:
        STATS["transfer_holds"] += 1
        STATS["transfer_hold_s"] += delay_ns / 1e9


def hold_until(floor_ns: int) -> None:
    """Sleep until the host monotonic clock reaches `floor_ns` (the transfer hold), counting it."""
    delay = floor_ns - time.monotonic_ns()
    if delay > 0:
        time.sleep(delay / 1e9)
        _count_hold(delay)
        with STATS_LOCK:  # how far past its floor the held thread ran again (the sleep's overshoot)
            HOPS["held_ops"] += 1
            HOPS["hold_overshoot_s"] += max(0, time.monotonic_ns() - floor_ns) / 1e9


class HoldTimer:
    """Runs callbacks at given host monotonic times, on one daemon thread of its own (started on first
    use): what completes a held future without holding the thread that completed the operation."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._cv = threading.Condition()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def at(self, deadline_ns: int, fn: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline_ns, next(self._order), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="prism-emu-hold", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                deadline = self._heap[0][0]
                now = time.monotonic_ns()
                if deadline > now:
                    self._cv.wait((deadline - now) / 1e9)
                    continue
                _, _, fn = heapq.heappop(self._heap)
            fn()  # (outside the lock: a callback may schedule another)


TIMER = HoldTimer()


def held_future(source: torch.futures.Future, floor: Callable[[], int], result) -> torch.futures.Future:
    """A future that completes with `result` once `source` did and the clock reached `floor()` (read when
    `source` completes), or with `source`'s error at once."""
    future = torch.futures.Future()

    def done(f: torch.futures.Future) -> None:
        try:
            f.value()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(exc)
            return
        at, now = floor(), time.monotonic_ns()
        if at > now:
            _count_hold(at - now)
            TIMER.at(at, lambda: future.set_result(result))
        else:
            future.set_result(result)

    source.add_done_callback(done)
    return future


class EmuWork(OwnResult, Work):
    """An emulated collective in flight: its exchange and completion run on the group's thread, which then
    calls `finish(floor)` (or `fail`); the program sees it complete no earlier than that floor, and a wait
    end `own` (ns: the calibrated own time of this rank's wait on it, `TimedReplay.wait_owns`) past the later
    of its call and the floor, as the model ends a wait (`clock_rule.wait_ends`: a member's lag behind the
    first member to see the completion; the future and `is_completed`, which have no call time, at the floor
    + `own`). Without the own time, a rank the model has lagging saw every held collective early (session
    17: 35.6-48.6 ms an iteration in dp8, tp2dp4, tp4dp2 of session 16's call 2)."""

    def __init__(self, result, own: int = 0) -> None:
        super().__init__()
        self.inner = torch.futures.Future()
        self.own = max(0, int(own))
        self.floor = 0
        self.exchanged = 0  # (host monotonic ns: when its group thread finished the exchange)
        self._result = result
        self.future: torch.futures.Future | None = None
        self.lock = threading.Lock()

    def finish(self, floor: int, issued: int = 0, began: int = 0) -> None:
        self.floor = floor
        self.exchanged = time.monotonic_ns()
        with STATS_LOCK:
            HOPS["protocol_ops"] += 1
            HOPS["queue_s"] += (began - issued) / 1e9
            HOPS["exchange_s"] += (self.exchanged - began) / 1e9
        self.inner.set_result(self._result)

    def fail(self, exc: BaseException) -> None:
        self.inner.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        called = time.monotonic_ns()
        self.inner.wait()
        woken = time.monotonic_ns()
        if self.exchanged and called < self.exchanged:
            with STATS_LOCK:
                HOPS["waited_ops"] += 1
                HOPS["wake_s"] += max(0, woken - max(self.exchanged, called)) / 1e9
        hold_until(max(called, self.floor) + self.own if self.own and self.floor else self.floor)
        return True

    def _held(self) -> int:
        return self.floor + self.own if self.floor else 0

    def get_future(self) -> torch.futures.Future:
        with self.lock:
            if self.future is None:
                self.future = held_future(self.inner, self._held, self._result)
        return self.future

    def is_completed(self) -> bool:
        return self.inner.done() and time.monotonic_ns() >= self._held()


class NativeWork(OwnResult, Work):
    """A native collective of an all-sandbox group in flight (`EmulateTransport._native`): `wait` waits
    for gloo's works on the caller's thread, then completes (host copies back, a reduction's fold) and
    holds until `floor`; `get_future` does the same from gloo's callback (the hold by `TIMER`, never on
    gloo's thread). The completion runs once, whoever gets there first."""

    def __init__(self, works: list[Work], finish, floor: int, result) -> None:
        super().__init__()
        self.works, self.finish, self.floor, self._result = works, finish, floor, result
        self.lock = threading.Lock()
        self.done = False
        self.future: torch.futures.Future | None = None

    def _complete(self, in_callback: bool = False) -> None:
        if self.done:
            return
        # the op's error raises here; never under the lock: gloo runs the future's callbacks (which
        # complete too) before it wakes `wait`, and a callback must not wait on its own work
        for w in self.works:
            w.get_future().value() if in_callback else w.wait()
        with self.lock:
            if self.done:
                return
            with torch.no_grad():
                self.finish()
            self.done = True
            with STATS_LOCK:
                STATS["collectives"] += 1

    def wait(self, timeout=None) -> bool:
        self._complete()
        hold_until(self.floor)
        return True

    def get_future(self) -> torch.futures.Future:
        if self.future is None:
            completed = torch.futures.Future()

            def done(_f=None) -> None:
                try:
                    self._complete(in_callback=True)
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                    completed.set_exception(exc)
                    return
                completed.set_result(self._result)

            self.future = held_future(completed, lambda: self.floor, self._result)
            futs = [w.get_future() for w in self.works]
            if not futs:
                done()
            else:
                (futs[0] if len(futs) == 1 else torch.futures.collect_all(futs)).add_done_callback(done)
        return self.future

    def is_completed(self) -> bool:
        if not self.done and not all(w.is_completed() for w in self.works):
            return False
        if time.monotonic_ns() < self.floor:
            return False
        self._complete()
        return True


class SourceWork(Forwarding, Work):
    """A recv's work that also says who sent (what `recv_anysource` answers)."""

    def __init__(self, inner: Work, src: int) -> None:
        super().__init__()
        self._inner, self._src = inner, src

    def _source_rank(self) -> int:
        return self._src


class LocalSend(OwnResult, Work):
    """A send of the timed emulation, complete for the program at once (`SendQueue`)."""

    def __init__(self, result) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout=None) -> bool:
        SENDS.check()
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self._result)
        return future


class SendQueue:
    """The timed emulation's sends, each on a sender thread per (gloo instance, receiving participant), in
    the program's order there: a send's gloo work is waited on that thread, never the program's. The model
    (`prism.clock_rule`) has a send complete locally, and the calibrated timeline has it so (a send's wait
    lasts its own ~10 us in the slices' calibration), while a gloo send completes only once its receiver
    posted the recv: with the program's thread in that wait a sandbox rank sending to a later pipeline stage
    (another sandbox rank, or a virtual one, whose recv the worker posts at its calibrated arrival) waited
    for the receiver's arrival, which the prediction it is replayed on has not (session 17,
    `docs/fidelity.md`: tp2pp4-mb4's sends 36.6 ms an iteration past the model). An error of a send is raised
    by the program's next send, wait, or the rank's end (`drain`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[tuple[int, int], ThreadPoolExecutor] = {}
        self._pending: list = []
        self._error: BaseException | None = None

    def send(self, pg, tensors: list[torch.Tensor], dst: int, tag: int) -> LocalSend:
        self.check()
        copies = [t.detach().clone() for t in tensors]  # the program may write its buffer once "sent"
        with self._lock:
            pool = self._threads.get((id(pg), dst))
            if pool is None:
                pool = self._threads[(id(pg), dst)] = ThreadPoolExecutor(1, thread_name_prefix="prism-emu-send")
            self._pending = [(f, what) for f, what in self._pending if not f.done()]
            self._pending.append((pool.submit(self._run, pg, copies, dst, tag), (dst, tag)))
        return LocalSend(list(tensors))

    def _run(self, pg, tensors, dst: int, tag: int) -> None:
        try:
            pg.send(tensors, dst, tag).wait()
        except BaseException as exc:  # noqa: BLE001 - raised on the program's thread (`check`)
            self._error = self._error or exc

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every send went out (the rank's end), raising the first error. A send still out after
        `timeout_s` (default: the hang watchdog's, `PRISM_HANG_TIMEOUT`; 0 or None: no bound) is a hang: its
        receiver never posted the recv. The watchdog cannot see it (the program's send completed locally), so it
        is named here, not waited out."""
        if timeout_s is None:
            from prism.runtime import watchdog

            timeout_s = watchdog.timeout_from_env()
        deadline = time.monotonic() + timeout_s if timeout_s else None
        with self._lock:
            pending = list(self._pending)
        for f, (dst, tag) in pending:
            try:
                f.result(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                late = [f"to group rank {d} (tag {t})" for g, (d, t) in pending if not g.done()]
                raise TimeoutError(
                    f"prism emulate: {len(late)} send(s) of this sandbox rank never went out within "
                    f"{timeout_s:g} s of its end ({', '.join(late[:4])}{', ...' if len(late) > 4 else ''}): the "
                    "receiver never posted the matching recv; the program's sends and receives do not pair up "
                    f"as in the capture. ({settings.HANG_TIMEOUT.name} sets the bound)") from None
        self.check()


SENDS = SendQueue()


def write_rank_stats(rank: int) -> None:
    """At the sandbox rank's end: its transports' numbers (`STATS`, `HOPS`), for meta.json (`emulation`);
    first, every send still going out (`SENDS.drain`)."""
    SENDS.drain()
    folder = settings.STATUS_DIR.get()
    if folder and STATS["groups"]:  # (not in the zygote, which has no groups)
        path = Path(folder) / f"emulate-rank{rank}.json"
        tmp = path.with_name(path.name + ".tmp")
        fold_cuda = sys.modules.get("prism.runtime.emulate.fold_cuda")  # loaded only where a CUDA tensor was folded
        diagnostics = dict(HOPS, threads_cpu_s=thread_cpu.by_thread())
        tmp.write_text(json.dumps(dict(STATS, cuda_folds=fold_cuda.launches if fold_cuda else 0,
                                       diagnostics=diagnostics)))
        os.replace(tmp, path)



class StreamOrder:
    """The order between a CUDA op's caller and the group thread that carries it (`stream_order`).

    Made at the op's call: an event on the caller's current stream. The group thread runs on the tensors'
    device (`device()`), waits for that event before it reads the inputs or writes the outputs
    (`inputs_ready`), and waits for its own stream once the outputs are written (`outputs_written`), before
    the work completes. Its stream is the device's default stream, ordered neither after nor before the side
    streams a program calls from (FSDP2 issues its all-gathers and reduce-scatters on its own): without the
    first wait it could read a contribution before the kernel writing it ran, without the second the caller
    could read an output whose device-to-device copy had not run. A real backend orders the same way: NCCL's
    stream waits for the caller's at the op's issue, and the caller's for NCCL's at the wait."""

    def __init__(self, device: torch.device) -> None:
        self.dev = device
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(device))

    def device(self):
        return torch.cuda.device(self.dev)

    def inputs_ready(self) -> None:
        self.event.synchronize()

    def outputs_written(self) -> None:
        torch.cuda.current_stream(self.dev).synchronize()


def stream_order(tensors: list[torch.Tensor]) -> StreamOrder | None:
    """A `StreamOrder` where an op's tensors are CUDA (their first one's device), else None."""
    cuda = next((t for t in tensors if t.is_cuda), None)
    return None if cuda is None else StreamOrder(cuda.device)
