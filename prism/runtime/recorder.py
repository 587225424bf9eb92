"""PrismTrace recording: one `Recorder` per rank, appended to by the backend and the global hooks.

The hot path is a tuple append per event plus two clock reads; columns are built only when a batch is
flushed to the rank's raw stream (`<raw dir>/rank=R/events.arrow`, Arrow IPC stream, schema
`prism.schemas.RAW_EVENTS`). A compute event is the span between the end of one recorded event and the
start of the next.

Clocks: `cpu_ns` is the CPU time of the recording thread inside the span (-1 when the span starts on one
thread and ends on another: torch runs a CUDA backward pass on its own device thread, and two threads'
CPU clocks cannot be subtracted). `device_ns` on CPU equals `cpu_ns`; on CUDA (`device="cuda"`) it is
the GPU time between the span's boundaries on the rank's current stream, from CUDA events recorded at
each boundary (`_DeviceClock`): the events are only queued on the hot path and read when complete, at
each iteration end (those already done) and at a flush (waiting for the last ones). A negative duration
is an error naming the rank and the event.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import pyarrow as pa

from prism import job_paths, schemas
from prism.runtime.memory import MemoryProbe

_wall = time.monotonic_ns
_cpu = time.thread_time_ns

# Column order of the tuples kept in memory (a prefix of RAW_EVENTS without `rank`).
_COLUMNS = [f.name for f in schemas.RAW_EVENTS if f.name != "rank"]
_DEVICE_NS = _COLUMNS.index("device_ns")
_W = len(_COLUMNS)  # a row's fields: the rows in memory are one flat list, row i at [i * _W, (i + 1) * _W)
_PEER, _ASYNC, _KIND, _OP, _ITERATION = (_COLUMNS.index(c) for c in ("peer", "is_async", "kind", "op", "iteration"))
_FLUSH_EVERY = 65536
_COMPUTE, _MARKER = schemas.KIND_COMPUTE, schemas.KIND_MARKER


class NegativeDuration(RuntimeError):
    """A clock went backwards inside an event: the trace would be wrong, so the rank stops."""


def _event_api(torch):
    """(record, query, elapsed) of a CUDA event, called without `torch.cuda.Event`'s Python wrappers where torch's own
    class is in use: `record(ev)` on the current stream (`Event.record()` builds it through
    `torch.cuda.current_stream()`: `_lazy_init`, `_get_device_index(None, optional=True)` - ~20 Python calls, an
    environment read by `is_available` - and a new `Stream` object, each record); here the stream object for each
    (stream id, device, type) `torch._C._cuda_getCurrentStream` answers is made once and kept, and the record is the
    base class's (`cudaEventRecord` on that stream, as before). Plain method calls where `torch.cuda.Event` is not
    torch's (a test's fake)."""
    base = getattr(torch._C, "_CudaEventBase", None)
    event = torch.cuda.Event
    streams_mod = getattr(torch.cuda, "streams", None)
    if (base is None or not isinstance(event, type) or not issubclass(event, base) or streams_mod is None
            or event.record is not getattr(streams_mod.Event, "record", None)
            or not hasattr(torch._C, "_cuda_getCurrentStream")):
        return (lambda ev: ev.record()), (lambda ev: ev.query()), (lambda start, end: start.elapsed_time(end))
    torch.cuda._lazy_init()  # as the first `Event.record()` did (the recorder marks one event when it is made)
    record, current, device, stream_cls = base.record, torch._C._cuda_getCurrentStream, torch._C._cuda_getDevice, torch.cuda.Stream
    streams: dict = {}

    def record_current(ev) -> None:
        key = current(device())
        stream = streams.get(key)
        if stream is None:  # the same object torch.cuda.current_stream() would make for this stream
            stream = streams[key] = stream_cls(stream_id=key[0], device_index=key[1], device_type=key[2])
        record(ev, stream)

    return record_current, base.query, base.elapsed_time


class _DeviceClock:
    """CUDA events on the current stream at event boundaries, resolved lazily into `device_ns`."""

    def __init__(self) -> None:
        import torch

        self._event = lambda: torch.cuda.Event(enable_timing=True)
        self._record, self._query, self._elapsed = _event_api(torch)
        self._free: list = []
        self._pending: list[tuple[int, object, object]] = []  # (row index, start event, end event)

    def mark(self):
        ev = self._free.pop() if self._free else self._event()
        self._record(ev)
        return ev

    def span(self, index: int, start, end) -> None:
        self._pending.append((index, start, end))

    def _completed(self) -> int:
        """How many of the pending spans, from the first, have completed: on one stream the events complete in
        the order they were recorded, so the answer is found by bisection on their end events (a few queries
        instead of one a span; the spans an iteration end finds complete are the same as querying each in turn
        up to the first incomplete one)."""
        pending, query = self._pending, self._query
        lo, hi = 0, len(pending)  # spans [0, lo) are complete; [hi, n) are not
        if hi and query(pending[-1][2]):
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi) // 2
            if query(pending[mid][2]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def resolve(self, rows: list[tuple], rank: int, wait: bool) -> None:
        """Write the device time of every completed span into `rows` (all of them with `wait`)."""
        pending = self._pending
        if wait:
            for _, _, end in pending:
                end.synchronize()
            complete = len(pending)
        else:
            complete = self._completed()
        elapsed, free = self._elapsed, self._free
        done = 0
        for index, start, end in pending[:complete]:
            try:
                ms = elapsed(start, end)
            except RuntimeError:
                if wait:
                    raise
                break  # (events on several streams: one not complete after all; read at a later iteration end)
            ns = round(ms * 1e6)
            at = index * _W
            if ns < 0:
                raise NegativeDuration(f"rank {rank}: event seq {rows[at]} ({rows[at + 1]} {rows[at + 2]}) has "
                                       f"negative device time {ns} ns (its CUDA events were recorded on different "
                                       "streams)")
            rows[at + _DEVICE_NS] = ns
            free.append(start)
            done += 1
        del pending[:done]


class Recorder:
    """Collects one rank's events and writes them to its raw stream."""

    def __init__(self, rank: int, out_dir: Path, device: str = "cpu") -> None:
        self.rank = rank
        self.dir = Path(out_dir) / f"rank={rank}"
        self.dir.mkdir(parents=True, exist_ok=True)
        # the buffered events, one flat list (row i: its fields at [i * _W, (i + 1) * _W), in `_COLUMNS` order):
        # a tuple a row would be a container object kept until the flush, 34 a step of the reference workload,
        # and those alone set off the garbage collections (none ran in an off step of the interleaved bench)
        self._rows: list = []
        self._seq = 0
        self._groups: list[tuple] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema = schemas.with_version(schemas.RAW_EVENTS, rank=rank)
        self._lock = threading.Lock()
        self._completions: dict[int, int] = {}  # work_id -> monotonic ns its result was ready
        self._pending_async: dict[int, int] = {}  # work_id -> index in _rows of the op (until waited)
        self._unresolved: dict[int, int] = {}  # work_id -> index in _rows of a recv from any source
        self.memory = MemoryProbe(device)
        self.iteration = 0
        self.microbatch = -1
        self.last_marker: tuple[str | None, int] = (None, -1)  # (op, its microbatch): where the rank is
        self.closed = False
        self._clock = _DeviceClock() if device.startswith("cuda") else None
        self._last_end_wall = _wall()
        self._last_end_cpu = _cpu()
        self._last_end_thread = threading.get_ident()
        self._last_end_event = self._clock.mark() if self._clock else None

    # -- the hot path -------------------------------------------------------------------------------
    def check(self, kind: str, op: str, group: str, group_seq: int, peer: int, tag: int, nbytes: int) -> None:
        """Called before a communication op is issued (a slice run checks it against its capture)."""

    def begin(self) -> tuple:
        """Start an event: closes the compute segment since the previous event; returns (wall, cpu, ev)."""
        wall, cpu = _wall(), _cpu()
        clock = self._clock
        ev = clock.mark() if clock is not None else None
        # two threads' CPU clocks cannot be subtracted: unknown (-1) when the span changed thread
        seg_cpu = cpu - self._last_end_cpu if threading.get_ident() == self._last_end_thread else -1
        if seg_cpu > 0 or wall - self._last_end_wall > 0:
            self._rows += (
                self._seq, schemas.KIND_COMPUTE, "compute", None, -1, -1, -1, 0, None, None, False, -1,
                self.iteration, self.microbatch, self._last_end_wall, wall, seg_cpu, seg_cpu, -1, -1, -1, -1, 0,
            )
            self._seq += 1
            if clock is not None:
                clock.span(len(self._rows) // _W - 1, self._last_end_event, ev)
        return wall, cpu, ev

    def end(
        self,
        start: tuple[int, int],
        kind: str,
        op: str,
        group: str | None = None,
        group_seq: int = -1,
        peer: int = -1,
        tag: int = 0,
        nbytes: int = 0,
        dtype: str | None = None,
        shape: str | None = None,
        work_id: int = -1,
        mem: tuple[int, int, int] = (-1, -1, -1),
    ) -> int:
        """Finish an event begun with `begin` (on the same thread); returns its index."""
        wall, cpu = _wall(), _cpu()
        dcpu = cpu - start[1]
        if dcpu < 0 or wall < start[0]:
            raise NegativeDuration(f"rank {self.rank}: event seq {self._seq} ({kind} {op}) has a negative duration "
                                   f"(cpu {dcpu} ns, wall {wall - start[0]} ns): begin and end on different threads?")
        self._rows += (
            self._seq, kind, op, group, group_seq, peer, tag, nbytes, dtype, shape, False, work_id,
            self.iteration, self.microbatch, start[0], wall, dcpu, dcpu, -1, mem[0], mem[1], mem[2], 0,
        )
        self._seq += 1
        self._last_end_wall, self._last_end_cpu = wall, cpu
        self._last_end_thread = threading.get_ident()
        index = len(self._rows) // _W - 1
        if self._clock is not None:
            ev = self._clock.mark()
            self._clock.span(index, start[2], ev)
            self._last_end_event = ev
        if work_id >= 0 and kind != schemas.KIND_WAIT:
            self._pending_async[work_id] = index
        return index

    def await_peer(self, work_id: int) -> None:
        """The op just recorded is a recv from any source: its peer is filled in by `resolve_peer` (its
        row stays in memory until then)."""
        self._unresolved[work_id] = len(self._rows) // _W - 1

    def resolve_peer(self, work_id: int, peer: int) -> None:
        """The recv from any source `work_id` received from global rank `peer` (any thread)."""
        with self._lock:
            index = self._unresolved.pop(work_id, None)
            if index is not None:
                self._rows[index * _W + _PEER] = peer

    def completed(self, work_id: int) -> None:
        """Called from a communication thread when an op's result is ready."""
        self._completions[work_id] = _wall()

    def completed_by(self, work_id: int, wall_ns: int) -> None:
        """The op's result was ready at the latest at `wall_ns` (when a wait found it, or started)."""
        self._completions.setdefault(work_id, wall_ns)

    def waited(self, work_id: int, sync: bool) -> None:
        """The program waits on `work_id`; `sync`: torch's own blocking call waits right after issuing."""
        index = self._pending_async.pop(work_id, None)
        if index is not None and not sync:
            self._rows[index * _W + _ASYNC] = True

    def buffered(self) -> list[tuple]:
        """The events not flushed yet, a tuple each (`_COLUMNS` order): a copy, for reading."""
        rows = self._rows
        return [tuple(rows[at:at + _W]) for at in range(0, len(rows), _W)]

    @property
    def recorded(self) -> int:
        """How many events this rank has recorded so far."""
        return self._seq

    @property
    def last_end_ns(self) -> int:
        return self._last_end_wall

    def resync(self, wall_ns: int | None = None) -> None:
        """Forget the time since the last event (capture: the rank was parked outside any event); `wall_ns`:
        the next event starts then (emulate: at the common start t0) instead of now."""
        self._last_end_wall, self._last_end_cpu = _wall() if wall_ns is None else wall_ns, _cpu()
        self._last_end_thread = threading.get_ident()
        if self._clock is not None:
            self._last_end_event = self._clock.mark()

    def marker(self, op: str) -> None:
        """A marker event: `begin()`, the memory sample, `end(start, marker, op, mem=...)`, in that order, with the
        same rows, clock reads and CUDA events as those two calls (`_marker_by_calls`; `tests/unit/
        test_recorder_fast_paths.py` compares them), in one frame: the reference workload records 17 a step."""
        wall, cpu = _wall(), _cpu()
        clock = self._clock
        ev = clock.mark() if clock is not None else None
        thread = threading.get_ident()
        rows, seq, last_wall = self._rows, self._seq, self._last_end_wall
        seg_cpu = cpu - self._last_end_cpu if thread == self._last_end_thread else -1
        if seg_cpu > 0 or wall - last_wall > 0:
            rows += (seq, _COMPUTE, "compute", None, -1, -1, -1, 0, None, None, False, -1, self.iteration,
                     self.microbatch, last_wall, wall, seg_cpu, seg_cpu, -1, -1, -1, -1, 0)
            seq += 1
            self._seq = seq
            if clock is not None:
                clock.span(len(rows) // _W - 1, self._last_end_event, ev)
        mem = self.memory.sample()
        wall_end, cpu_end = _wall(), _cpu()
        dcpu = cpu_end - cpu
        if dcpu < 0 or wall_end < wall:
            raise NegativeDuration(f"rank {self.rank}: event seq {seq} ({_MARKER} {op}) has a negative duration "
                                   f"(cpu {dcpu} ns, wall {wall_end - wall} ns): begin and end on different threads?")
        microbatch = self.microbatch
        rows += (seq, _MARKER, op, None, -1, -1, 0, 0, None, None, False, -1, self.iteration, microbatch, wall,
                 wall_end, dcpu, dcpu, -1, mem[0], mem[1], mem[2], 0)
        self._seq = seq + 1
        self._last_end_wall, self._last_end_cpu = wall_end, cpu_end
        self._last_end_thread = threading.get_ident()
        if clock is not None:
            end_ev = clock.mark()
            clock.span(len(rows) // _W - 1, ev, end_ev)
            self._last_end_event = end_ev
        self.last_marker = (op, microbatch)
        if op == "iteration_end" and clock is not None:  # read the device times already known
            clock.resolve(rows, self.rank, wait=False)
        if len(rows) >= _FLUSH_EVERY * _W:  # flush between ops, never between an op and its wait
            self.flush(keep_last=op == "iteration_end")  # an iteration end stays open to `reopen_iteration`

    def _marker_by_calls(self, op: str) -> None:
        """`marker` as `begin` + `end` (what it was before it was one frame); a subclass that overrides `begin` or
        `end` gets this one as its `marker` (`__init_subclass__`)."""
        start = self.begin()
        self.end(start, schemas.KIND_MARKER, op, mem=self.memory.sample())
        self.last_marker = (op, self.microbatch)
        if op == "iteration_end" and self._clock is not None:  # read the device times already known
            self._clock.resolve(self._rows, self.rank, wait=False)
        if len(self._rows) >= _FLUSH_EVERY * _W:  # flush between ops, never between an op and its wait
            self.flush(keep_last=op == "iteration_end")  # an iteration end stays open to `reopen_iteration`

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if (cls.begin is not Recorder.begin or cls.end is not Recorder.end) and cls.marker is Recorder.marker:
            cls.marker = Recorder._marker_by_calls

    def reopen_iteration(self) -> bool:
        """The last marker, an `iteration_end`, did not end the iteration (another outermost optimizer step
        of it followed, with no forward between: `markers`): it becomes an `optimizer_step` marker and the
        events recorded since return to its iteration. False (nothing changed) if the last marker is not
        an `iteration_end` still in memory."""
        rows = self._rows
        with self._lock:
            for at in range(len(rows) - _W, -1, -_W):
                if rows[at + _KIND] == schemas.KIND_MARKER:
                    break
            else:
                return False
            if rows[at + _OP] != "iteration_end":
                return False
            rows[at + _OP] = "optimizer_step"
            for k in range(at + _W + _ITERATION, len(rows), _W):
                rows[k] -= 1
        self.iteration -= 1
        return True

    # -- groups and output ----------------------------------------------------------------------------
    def add_group(self, name: str, desc: str | None, members: list[int], backend: str) -> None:
        self._groups.append((self.rank, name, desc, members, backend))

    def flush(self, final: bool = False, keep_last: bool = False) -> None:
        """Write the buffered events as one record batch (resolving async completion times). Rows from the
        first recv from any source whose sender is not known yet stay buffered (unless `final`: then its
        peer stays -1, the program never completed it); with `keep_last`, the last row too."""
        with self._lock:
            n = len(self._rows) // _W
            cut = n if final else min(self._unresolved.values(), default=n)
            if keep_last and not final:
                cut = min(cut, n - 1)
            if not cut:
                return
            if self._clock is not None:
                self._clock.resolve(self._rows, self.rank, wait=True)
            rows, self._rows = self._rows[:cut * _W], self._rows[cut * _W:]
            self._unresolved = {w: i - cut for w, i in self._unresolved.items() if i >= cut}
            # ops not waited on yet are being overlapped with what follows them (or consumed through
            # their future, as DDP does): they are async.
            kept = {}
            for work_id, index in self._pending_async.items():
                if index < cut:
                    rows[index * _W + _ASYNC] = True
                else:
                    kept[work_id] = index - cut
            self._pending_async = kept
            data = {"rank": pa.array([self.rank] * cut, pa.int32())}
            for k, name in enumerate(_COLUMNS):
                data[name] = rows[k::_W]
            done = self._completions
            data["t_complete_ns"] = [
                done.pop(w, -1) if w >= 0 and k != schemas.KIND_WAIT else -1
                for w, k in zip(data["work_id"], data["kind"])
            ]
            batch = pa.RecordBatch.from_pydict(
                {f.name: data[f.name] for f in self._schema}, schema=self._schema
            )
            if self._writer is None:
                self._sink = pa.OSFile(str(self.dir / "events.arrow.tmp"), "wb")
                self._writer = pa.ipc.new_stream(self._sink, self._schema)
            self._writer.write_batch(batch)

    def close(self) -> None:
        """Flush everything and publish the rank's stream and groups (atomic renames)."""
        if self.closed:
            return
        self.closed = True
        self.flush(final=True)
        if self._writer is None:  # no events at all: still publish an empty stream
            self._sink = pa.OSFile(str(self.dir / "events.arrow.tmp"), "wb")
            self._writer = pa.ipc.new_stream(self._sink, self._schema)
        self._writer.close()
        self._sink.close()
        os.replace(self.dir / "events.arrow.tmp", job_paths.stream_file(self.dir, "events"))
        gschema = schemas.with_version(schemas.RAW_GROUPS)
        table = pa.Table.from_pylist(
            [dict(zip(gschema.names, g)) for g in self._groups], schema=gschema
        )
        tmp = self.dir / "groups.arrow.tmp"
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, gschema) as writer:
            writer.write_table(table)
        os.replace(tmp, job_paths.stream_file(self.dir, "groups"))

    @property
    def peak_rss_bytes(self) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
