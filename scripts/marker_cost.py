"""What one PrismTrace marker costs the program's thread on CPU, and what reading the CUDA allocator's statistics
costs it (issue 21 item 6), without a profiler's inflation:

    .venv/bin/python scripts/marker_cost.py

- `Recorder.marker` with the CPU clock and the RSS probe, the probe alone, and begin + end without memory;
- the memory probe's CUDA read before a82c40d, emulated: torch.cuda.memory_allocated() (as its siblings) builds
  the allocator's nested statistics, flattens and sorts all of them in Python and returns one. Here the nested
  dict is built in Python (on CUDA, torch._C builds it in C++), so the flattening is what is measured beyond it.
The reference workload's step has 17 markers (4 microbatches x fwd_begin/fwd_end/bwd_begin/bwd_end, and the
iteration end): the per-step figures multiply by 17 (three readers a marker before a82c40d, one read after).
"""

from __future__ import annotations

import collections
import statistics
import tempfile
import time
from pathlib import Path

from prism.runtime.memory import MemoryProbe
from prism.runtime.recorder import Recorder

MARKERS_PER_STEP = 17
KINDS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
         "inactive_split_bytes", "requested_bytes")


def nested_stats() -> dict:
    """The shape of torch.cuda.memory_stats_as_nested_dict() (torch 2.x)."""
    metrics = lambda: {m: 123456789 for m in ("current", "peak", "allocated", "freed")}  # noqa: E731
    stats = {k: {p: metrics() for p in ("all", "small_pool", "large_pool")} for k in KINDS}
    stats.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0, num_device_alloc=5, num_device_free=0,
                 max_split_size=-1, oversize_allocations=metrics(), oversize_segments=metrics(),
                 reserved_bytes_by_private_pools={})
    return stats


def flattening_reader() -> int:
    """What torch.cuda.memory_stats() does with the nested statistics (torch/cuda/memory.py), then one key."""
    result = []

    def add(prefix, obj):
        if isinstance(obj, dict):
            prefix = prefix + "." if prefix else prefix
            for key, value in obj.items():
                add(prefix + (key if isinstance(key, str) else "_".join(map(str, key))), value)
        else:
            result.append((prefix, obj))

    add("", nested_stats())
    result.sort()
    return collections.OrderedDict(result).get("allocated_bytes.all.current", 0)


def one_read() -> tuple[int, int, int]:
    stats = nested_stats()
    allocated = stats["allocated_bytes"]["all"]
    return allocated["current"], allocated["peak"], stats["reserved_bytes"]["all"]["current"]


def per_call_us(fn, n: int = 3000, rounds: int = 7) -> tuple[float, float]:
    """(best, median) of `rounds` timings of `n` calls, us a call."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for i in range(n):
            fn(i)
        times.append((time.perf_counter_ns() - t0) / n / 1e3)
    return min(times), statistics.median(times)


def main() -> None:
    rec = Recorder(0, Path(tempfile.mkdtemp(prefix="prism-marker-cost-")))
    ops = ["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"]
    probe = MemoryProbe("cpu")
    rows = [
        ("Recorder.marker (CPU clock, RSS probe)", per_call_us(lambda i: rec.marker(ops[i & 3])), 1),
        ("MemoryProbe.sample on CPU (statm + getrusage)", per_call_us(lambda i: probe.sample()), 1),
        ("Recorder.begin + end, no memory", per_call_us(lambda i: rec.end(rec.begin(), "marker", "x")), 1),
        ("CUDA read before a82c40d: one flattening reader", per_call_us(lambda i: flattening_reader()), 3),
        ("CUDA read after a82c40d: the nested statistics once", per_call_us(lambda i: one_read()), 1),
    ]
    print(f"{'what':<54} {'best us':>8} {'median us':>10} {'calls/marker':>13} {'ms/step (median)':>17}")
    for name, (best, median), calls in rows:
        print(f"{name:<54} {best:8.2f} {median:10.2f} {calls:13d} {median * calls * MARKERS_PER_STEP / 1e3:17.3f}")


if __name__ == "__main__":
    main()
