"""The recorder's per-event cuts of session 17 (issue 21 item 6: the launch-bound overhead) leave the trace as it was:
- `Recorder.marker` in one frame writes the rows `begin` + memory sample + `end` wrote (`_marker_by_calls`), with
  the same clock reads and CUDA events, in the same order;
- the iteration end's read of the CUDA spans finds the completed ones by bisection: the same spans, the same device
  times, as querying each in turn up to the first incomplete one, with fewer queries;
- a CUDA event is recorded on the current stream through the base class (no `torch.cuda.current_stream()` a record),
  on the stream object `current_stream()` would make;
- the allocator's statistics are read by `torch._C._cuda_memoryStats(current device)` directly, the call
  `torch.cuda.memory_stats_as_nested_dict()` ends at."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from prism.runtime import memory as memory_module
from prism.runtime import recorder as recorder_module
from prism.runtime.recorder import Recorder, _DeviceClock

_REAL_IDENT = threading.get_ident
MARKERS = ["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 4 + ["iteration_end"]


class FakeEvent:
    """torch.cuda.Event on a GPU `lag` records behind the CPU; `log` keeps every call in order."""

    log: list = []
    live: list = []
    lag = 0
    recorded = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.index, self.waited = None, False
        FakeEvent.live.append(self)
        FakeEvent.log.append(("created",))

    def record(self, stream=None) -> None:
        FakeEvent.recorded += 1
        self.index, self.waited = FakeEvent.recorded, False
        FakeEvent.log.append(("record", self.index))

    def query(self) -> bool:
        FakeEvent.log.append(("query", self.index))
        return self.waited or FakeEvent.recorded - self.index >= FakeEvent.lag

    def synchronize(self) -> None:
        self.waited = True  # (every event recorded before it too: one stream)
        for ev in FakeEvent.live:
            if ev.index is not None and ev.index <= self.index:
                ev.waited = True
        FakeEvent.log.append(("synchronize", self.index))

    def elapsed_time(self, end: "FakeEvent") -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end.index - self.index) * 1.25e-3


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.log, FakeEvent.lag, FakeEvent.recorded, FakeEvent.live = [], 0, 0, []
    reads = itertools.count(1)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: (
        lambda n: {"allocated_bytes": {"all": {"current": 10 * n, "peak": 20 * n}},
                   "reserved_bytes": {"all": {"current": 30 * n}}})(next(reads)))
    return FakeEvent


@pytest.fixture
def ticking(monkeypatch):
    """Both clocks deterministic: each read is 1000 ns (wall) / 700 ns (cpu) after the one before."""
    def restart():
        wall, cpu = itertools.count(10_000, 1000), itertools.count(5_000, 700)
        monkeypatch.setattr(recorder_module, "_wall", lambda: next(wall))
        monkeypatch.setattr(recorder_module, "_cpu", lambda: next(cpu))
    return restart


def _program(rec: Recorder, steps: int = 3) -> None:
    """Markers with an op between some of them (begin/end, as the backend records one) and one marker on another
    thread (a CUDA backward's device thread)."""
    for step in range(steps):
        for k, op in enumerate(MARKERS):
            if k == 5:
                start = rec.begin()
                rec.end(start, "collective", "all_reduce", group="0", group_seq=step, nbytes=64, work_id=step)
            if k == 6 and step == 1:
                t = threading.Thread(target=rec.marker, args=(op,))
                t.start()
                t.join()
                continue
            rec.marker(op)
            if op == "iteration_end":
                rec.iteration += 1


def _stream(rec: Recorder) -> dict:
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        return r.read_all().to_pydict()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_one_frame_marker_writes_the_rows_and_events_begin_and_end_wrote(tmp_path: Path, ticking, fake_cuda,
                                                                          monkeypatch, device) -> None:
    streams, logs = [], []
    for name, marker in (("by-calls", Recorder._marker_by_calls), ("one-frame", Recorder.marker)):
        ticking()
        FakeEvent.log, FakeEvent.recorded = [], 0
        monkeypatch.setattr(Recorder, "marker", marker)
        monkeypatch.setattr(recorder_module.threading, "get_ident", _ident_by_thread())
        rec = Recorder(0, tmp_path / name, device=device)
        reads = itertools.count(1)  # RSS changes between the runs: a deterministic probe
        rec.memory.sample = lambda: (lambda n: (n, 2 * n, -1))(next(reads))
        _program(rec)
        streams.append(_stream(rec))
        logs.append(list(FakeEvent.log))
    assert streams[0]["op"].count("fwd_begin") == 12
    for key in streams[0]:
        assert streams[0][key] == streams[1][key], (key, [(i, a, b) for i, (a, b) in enumerate(zip(streams[0][key], streams[1][key])) if a != b][:5])
    assert streams[0] == streams[1], "every column of every row, the clocks and the device times included"
    assert logs[0] == logs[1], "the same CUDA events created, recorded, queried in the same order"


def _ident_by_thread():
    """threading.get_ident, but the main thread is always 1 and any other 2 (the runs' thread ids differ)."""
    main, real = threading.main_thread().ident, _REAL_IDENT
    return lambda: 1 if real() == main else 2


def test_a_subclass_that_overrides_begin_keeps_its_begin_in_markers(tmp_path: Path) -> None:
    calls = []

    class Checked(Recorder):
        def begin(self):
            calls.append("begin")
            return super().begin()

    assert Checked.marker is Recorder._marker_by_calls
    Checked(0, tmp_path).marker("fwd_begin")
    assert calls == ["begin"]
    assert recorder_module.Recorder.marker is not Recorder._marker_by_calls


def _resolve_in_turn(clock: _DeviceClock, rows: list, rank: int) -> None:
    """The iteration end's read before session 17: each span's end event queried in turn, up to the first
    incomplete one."""
    done = 0
    for index, start, end in clock._pending:
        if not end.query():
            break
        rows[index * recorder_module._W + recorder_module._DEVICE_NS] = round(start.elapsed_time(end) * 1e6)
        clock._free.append(start)
        done += 1
    del clock._pending[:done]


@pytest.mark.parametrize("lag", [0, 1, 3, 17, 40])
def test_bisection_finds_the_spans_the_query_in_turn_found(tmp_path: Path, fake_cuda, ticking, monkeypatch,
                                                            lag) -> None:
    FakeEvent.lag = lag
    results, queries = [], []
    real = _DeviceClock.resolve
    for name in ("in-turn", "bisect"):
        ticking()
        FakeEvent.log, FakeEvent.recorded = [], 0
        monkeypatch.setattr(_DeviceClock, "resolve", real if name == "bisect" else (
            lambda self, rows, rank, wait: real(self, rows, rank, True) if wait else _resolve_in_turn(self, rows, rank)))
        rec = Recorder(0, tmp_path / name, device="cuda")
        rec.memory.sample = lambda: (1, 2, 3)
        per_step = []
        for _ in range(4):
            for op in MARKERS:
                rec.marker(op)
            per_step.append((len(rec._clock._pending), rec._rows[recorder_module._DEVICE_NS::recorder_module._W]))
        results.append(per_step)
        queries.append(sum(1 for c in FakeEvent.log if c[0] == "query"))
    assert results[0] == results[1], "the same spans resolved at each iteration end, with the same device times"
    if lag < 30:
        assert queries[1] < queries[0], f"fewer queries: {queries}"


def test_waiting_resolve_reads_every_span(tmp_path: Path, fake_cuda) -> None:
    FakeEvent.lag = 5
    rec = Recorder(0, tmp_path, device="cuda")
    rec.memory.sample = lambda: (1, 2, 3)
    for op in MARKERS:
        rec.marker(op)
    assert rec._clock._pending, "the GPU is 5 records behind: the last spans are pending at the iteration end"
    ev = _stream(rec)
    assert min(ev["device_ns"]) >= 0 and len(ev["device_ns"]) == 2 * len(MARKERS)


class _FakeStream:
    made = 0

    def __init__(self, stream_id=0, device_index=0, device_type=0, priority=0):
        _FakeStream.made += 1
        self.key = (stream_id, device_index, device_type)


class _FakeBase:
    def __init__(self, enable_timing=False):
        self.on = None

    def record(self, stream):
        self.on = stream.key

    def query(self):
        return True

    def elapsed_time(self, end):
        return 0.5


def test_an_event_is_recorded_on_the_current_stream_without_current_stream(monkeypatch) -> None:
    import types

    current = {"key": (3, 0, 1)}

    class Event(_FakeBase):
        def record(self, stream=None):  # torch's wrapper: current_stream() a record
            if stream is None:
                stream = _FakeStream(*current["key"])
            super().record(stream)

    fake_cuda = types.SimpleNamespace(Event=Event, streams=types.SimpleNamespace(Event=Event), Stream=_FakeStream,
                                      _lazy_init=lambda: None,
                                      current_stream=lambda: _FakeStream(*current["key"]))
    fake_c = types.SimpleNamespace(_CudaEventBase=_FakeBase, _cuda_getCurrentStream=lambda d: current["key"],
                                   _cuda_getDevice=lambda: 0)
    record, query, elapsed = recorder_module._event_api(types.SimpleNamespace(cuda=fake_cuda, _C=fake_c))
    a, b = Event(), Event()
    _FakeStream.made = 0
    for _ in range(5):
        record(a)
    assert a.on == (3, 0, 1) and _FakeStream.made == 1, "one stream object for the current stream, kept"
    current["key"] = (7, 0, 1)  # the program switched streams (torch.cuda.stream(s))
    record(b)
    assert b.on == (7, 0, 1), "recorded on the stream current at the record"
    Event.record(a)  # what torch's own path records on
    assert a.on == (7, 0, 1)
    assert query(a) is True and elapsed(a, b) == 0.5
    # a fake torch.cuda.Event (the tests'): plain method calls
    fake_cuda.Event = FakeEvent
    record, query, elapsed = recorder_module._event_api(types.SimpleNamespace(cuda=fake_cuda, _C=fake_c))
    FakeEvent.recorded = 0
    ev = FakeEvent()
    record(ev)
    assert ev.index == 1


def test_the_allocator_is_read_by_its_one_c_call(monkeypatch) -> None:
    import types

    calls = []
    stats = {"allocated_bytes": {"all": {"current": 5, "peak": 9}}, "reserved_bytes": {"all": {"current": 16}}}
    initialised = {"now": False}

    def nested(device=None):  # torch's: its Python path, then the C call
        return fake_c._cuda_memoryStats(0) if initialised["now"] else {}

    fake_memory = types.SimpleNamespace(memory_stats_as_nested_dict=nested)
    fake_cuda = types.SimpleNamespace(memory_stats_as_nested_dict=nested, memory=fake_memory,
                                      is_initialized=lambda: initialised["now"])
    fake_c = types.SimpleNamespace(_cuda_memoryStats=lambda d: calls.append(d) or stats, _cuda_getDevice=lambda: 2)
    read = memory_module._allocator_reader(types.SimpleNamespace(cuda=fake_cuda, _C=fake_c))
    assert read is not nested
    assert read() == {} and calls == [], "CUDA not initialised yet: nothing read (memory_stats_as_nested_dict's {})"
    initialised["now"] = True
    assert read() is stats and calls == [2], "the current device's statistics, one C call"
    fake_cuda.memory_stats_as_nested_dict = lambda device=None: stats  # patched (the tests' fakes): called as is
    assert memory_module._allocator_reader(types.SimpleNamespace(cuda=fake_cuda, _C=fake_c)) is \
        fake_cuda.memory_stats_as_nested_dict
    probe = memory_module.MemoryProbe("cpu")
    assert probe.sample()[2] == -1


def test_the_bench_uncut_state_runs_the_old_paths_and_is_undone(tmp_path: Path, fake_cuda, ticking) -> None:
    from prism.bench import interleave_rank

    ticking()
    rec = Recorder(0, tmp_path, device="cuda")
    rec.memory.sample = lambda: (1, 2, 3)
    api = (rec._clock._record, rec._clock._query, rec._clock._elapsed)
    part = interleave_rank.ABLATIONS["uncut"]
    part.apply(rec)
    assert rec.marker.__func__ is Recorder._marker_by_calls and rec._clock._completed() == 0
    part.undo(rec)
    assert (rec._clock._record, rec._clock._query, rec._clock._elapsed) == api
    assert "marker" not in rec.__dict__ and "_completed" not in rec._clock.__dict__


def _flushing_program(rec: Recorder) -> None:
    n = itertools.count(1)
    rec.memory.sample = lambda: (lambda k: (k, 2 * k, -1))(next(n))
    for step in range(6):
        for k, op in enumerate(["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 2):
            rec.marker(op)
            if k == 2:
                s = rec.begin()
                rec.end(s, "collective", "all_reduce", group="0", group_seq=step, nbytes=8, work_id=10 + step)
                if step % 2:
                    rec.waited(10 + step, sync=False)
                rec.completed(10 + step)
            if k == 4 and step == 2:
                s = rec.begin()
                rec.end(s, "p2p", "recv_anysource", group="0", work_id=99)
                rec.await_peer(99)
            if k == 6 and step == 4:
                rec.resolve_peer(99, 3)
        rec.marker("iteration_end")
        rec.iteration += 1
        if step == 3:
            rec.marker("iteration_end")
            rec.iteration += 1
            assert rec.reopen_iteration()


def test_the_flat_row_store_writes_the_same_stream_at_any_flush_size(tmp_path: Path, ticking, monkeypatch) -> None:
    streams = []
    for every in (65536, 7, 16):
        ticking()
        monkeypatch.setattr(recorder_module, "_FLUSH_EVERY", every)
        rec = Recorder(0, tmp_path / str(every))
        _flushing_program(rec)
        streams.append(_stream(rec))
    assert streams[0] == streams[1] == streams[2]
    ev = streams[0]
    assert ev["peer"][ev["op"].index("recv_anysource")] == 3, "the recv's sender, filled in across flushes"
    assert ev["op"].count("optimizer_step") == 1 and max(ev["iteration"]) == 5
    waited = [a for a, op in zip(ev["is_async"], ev["op"]) if op == "all_reduce"]
    assert waited == [True] * 6, "waited on later (sync=False), or never waited by the flush: async"
    assert [tuple(r[:3]) for r in Recorder(0, tmp_path / "b").buffered()] == []


def test_recording_keeps_no_container_object_an_event(tmp_path: Path) -> None:
    """A tuple a row would be a container object kept until the flush: 34 a step of the reference workload, which set
    off every garbage collection of the interleaved bench's on steps."""
    import gc

    rec = Recorder(0, tmp_path)
    rec.memory.sample = lambda: (1, 2, 3)
    for op in MARKERS:
        rec.marker(op)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for _ in range(20):
            for op in MARKERS:
                rec.marker(op)
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert len(rec.buffered()) == 2 * 21 * len(MARKERS)
    assert grown < 20, f"{grown} container objects kept for {20 * 2 * len(MARKERS)} rows"
