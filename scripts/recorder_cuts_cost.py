"""What each of session 17's recorder cuts saves a call, before and after in the same run (issue 21 item 6):

    .venv/bin/python scripts/recorder_cuts_cost.py [--device cuda] [--reps N]

Rows (per call, best and median of N rounds of 17 calls each, us; the reference workload's step has 17 markers, 34
CUDA events, 17 allocator reads and, at its iteration end, one read of ~34 pending spans):
- marker: `Recorder.marker` (one frame) against `Recorder._marker_by_calls` (`begin` + memory sample + `end`, as
  before), on the device's probe and clock;
- record: a CUDA event recorded by `torch.cuda.Event.record()` (its `torch.cuda.current_stream()` a call) against
  the recorder's `_event_api` record (the kept stream object, the base class's record);
- memory: `torch.cuda.memory_stats_as_nested_dict()` against the probe's `_allocator_reader` (its one C call);
- stats C call: `torch._C._cuda_memoryStats(device)` alone (what neither path avoids: ~130 statistics built);
- resolve: the iteration end's read of 34 pending spans, each end queried in turn (before) against bisection (after),
  with the events complete but the last one (the launch-bound case), and the queries each made.
On CPU (`--device cpu`, the default) torch has no CUDA: `record` and `memory` run torch's own Python path with its C
calls stubbed (`_cuda_getDevice`, `_cuda_getDeviceCount`, `_cuda_getCurrentStream`, `_cuda_memoryStats` answering
at once, a plain class for `Stream`), so they show the Python path's cost only - a lower bound of what the cut saves;
`marker` runs with the CPU probe (RSS) and no CUDA clock. On CUDA every call is real (nothing queued on the GPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def bench(fn, reps: int, calls: int = 17, between=None) -> tuple[float, float]:
    """(best, median) us a call over `reps` rounds of `calls` calls (`between()` after each round, not timed)."""
    per = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter_ns() - t0) / calls / 1e3)
        if between is not None:
            between()
    return min(per), statistics.median(per)


def stub_cuda(torch) -> None:
    """torch's CUDA Python path on a CPU build: its C calls answer at once."""
    torch._C._cuda_getDeviceCount = lambda: 1
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentStream = lambda device: (0, device, 1)
    stats = {k: {p: {m: 123456789 for m in ("current", "peak", "allocated", "freed")}
                 for p in ("all", "small_pool", "large_pool")}
             for k in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                       "active_bytes", "inactive_split_bytes", "requested_bytes")}
    torch._C._cuda_memoryStats = lambda device: stats
    torch.cuda._initialized = True

    class Stream:  # torch.cuda.Stream's __new__: its is_built() check, then the base class
        def __new__(cls, device=None, priority=0, **kwargs):
            torch.backends.cuda.is_built()  # (False on this build: called for its cost, not its answer)
            return object.__new__(cls)

        def __init__(self, device=None, priority=0, stream_id=0, device_index=0, device_type=0):
            self.key = (stream_id, device_index, device_type)

    torch.cuda.Stream = torch.cuda.streams.Stream = Stream

    class Base:
        def __init__(self, enable_timing=False):
            self.stream = None

        def record(self, stream):
            self.stream = stream

        def query(self):
            return True

        def elapsed_time(self, end):
            return 1.0

    class Event(Base):  # torch.cuda.Event's wrappers
        def record(self, stream=None):
            if stream is None:
                stream = torch.cuda.current_stream()
            super().record(stream)

        def query(self):
            return super().query()

        def elapsed_time(self, end):
            return super().elapsed_time(end)

    torch._C._CudaEventBase = Base
    torch.cuda.Event = torch.cuda.streams.Event = Event


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args(argv)
    import torch

    from prism.runtime import memory, recorder
    from prism.runtime.recorder import Recorder

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("recorder_cuts_cost: --device cuda but no CUDA device", file=sys.stderr)
            return 2
        torch.cuda.init()
        keep = torch.empty(1 << 20, device="cuda")  # the allocator holds something
        where = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    else:
        stub_cuda(torch)
        keep = None
        where = f"CPU, torch {torch.__version__}: torch's CUDA Python path with its C calls stubbed"
    rows = []

    def row(name, before, after, note=""):
        rows.append((name, before, after, note))

    # marker: on this device's probe and clock
    with tempfile.TemporaryDirectory() as tmp:
        rec = Recorder(0, Path(tmp), device="cuda" if args.device == "cuda" else "cpu")
        rec.iteration = 0
        by_calls = lambda: rec._marker_by_calls("fwd_begin")  # noqa: E731
        one_frame = lambda: rec.marker("fwd_begin")  # noqa: E731

        def drop() -> None:  # the round's rows and spans (their events back to the pool), as an iteration end does
            if rec._clock is not None:
                rec._clock.resolve(rec._rows, 0, wait=True)
            rec._rows.clear()

        for _ in range(3):  # warm both
            bench(by_calls, args.reps // 3, between=drop), bench(one_frame, args.reps // 3, between=drop)
        row("marker (begin+sample+end)", bench(by_calls, args.reps, between=drop),
            bench(one_frame, args.reps, between=drop), "Recorder._marker_by_calls vs Recorder.marker")
        drop()
        rec._clock = None
    # a CUDA event record
    ev = torch.cuda.Event(enable_timing=True)
    fast_record, fast_query, fast_elapsed = recorder._event_api(torch)
    row("event record", bench(lambda: ev.record(), args.reps), bench(lambda: fast_record(ev), args.reps),
        "Event.record() vs the base record on the kept current-stream object")
    ev2 = torch.cuda.Event(enable_timing=True)
    fast_record(ev2)
    if args.device == "cuda":
        torch.cuda.synchronize()
    row("event query", bench(lambda: ev.query(), args.reps), bench(lambda: fast_query(ev), args.reps),
        "Event.query() vs the base query")
    row("event elapsed_time", bench(lambda: ev.elapsed_time(ev2), args.reps),
        bench(lambda: fast_elapsed(ev, ev2), args.reps), "(both: 2 queries inside torch, then cudaEventElapsedTime)")
    # the allocator's statistics
    nested = torch.cuda.memory_stats_as_nested_dict
    reader = memory._allocator_reader(torch)
    device = torch._C._cuda_getDevice()
    three = lambda st: (st["allocated_bytes"]["all"]["current"], st["allocated_bytes"]["all"]["peak"],  # noqa: E731
                        st["reserved_bytes"]["all"]["current"])
    assert three(reader()) == three(nested()), "the same three statistics"
    row("allocator read", bench(nested, args.reps), bench(reader, args.reps),
        "memory_stats_as_nested_dict() vs _allocator_reader")
    row("  of which the C call", bench(lambda: torch._C._cuda_memoryStats(device), args.reps), None,
        "torch._C._cuda_memoryStats: the ~130 statistics built")
    # the iteration end's read of the pending spans
    clock = recorder._DeviceClock()
    n = 34
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    for e in events:
        fast_record(e)
    if args.device == "cuda":
        torch.cuda.synchronize()
    counts = {"query": 0}
    real_query = clock._query

    def counted(e):
        counts["query"] += 1
        return real_query(e) and e is not events[-1]  # the last span not complete (launch-bound: just recorded)

    clock._query = counted

    def in_turn():
        done = 0
        for _, _, end in pending:
            if not counted(end):
                break
            done += 1
        return done

    pending = [(i, events[i], events[i + 1]) for i in range(n)]
    clock._pending = pending
    before = bench(in_turn, args.reps, calls=1)
    q_before = counts["query"] / args.reps
    counts["query"] = 0
    after = bench(clock._completed, args.reps, calls=1)
    q_after = counts["query"] / args.reps
    assert in_turn() == clock._completed() == n - 1
    row(f"completed spans of {n} (queries)", before, after,
        f"each end queried in turn ({q_before:.0f} queries) vs bisection ({q_after:.0f}); per read, not per call")
    del keep
    print(f"recorder_cuts_cost: {where}; {args.reps} rounds of 17 calls (us a call: best / median)")
    print(f"{'call':<34} {'before best':>11} {'median':>8} {'after best':>11} {'median':>8} {'saved (median)':>15}  what")
    for name, b, a, note in rows:
        saved = f"{b[1] - a[1]:+15.2f}" if a is not None else ""
        after_s = f"{a[0]:11.2f} {a[1]:8.2f}" if a is not None else f"{'':>11} {'':>8}"
        print(f"{name:<34} {b[0]:11.2f} {b[1]:8.2f} {after_s} {saved:>15}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
