"""What PrismTrace's CUDA clock and memory probe do per marker (issue 21 item 6: +54 % a step on the H200), with
torch.cuda faked so that it runs on CPU: the allocator's statistics are read once a marker, as torch keeps them
(not through `memory_allocated()` and its siblings, which each flatten and sort all of them to return one), and
the CUDA events of the event boundaries are recorded and polled, never waited on, until the trace is flushed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch

from prism.runtime.memory import MemoryProbe
from prism.runtime.recorder import Recorder

MARKERS = ["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 4 + ["iteration_end"]  # a step of the reference workload


def _stats(allocated: int, peak: int, reserved: int) -> dict:
    """The shape of torch.cuda.memory_stats_as_nested_dict()."""
    pools = lambda cur, pk: {p: {"current": cur, "peak": pk, "allocated": 0, "freed": 0}  # noqa: E731
                             for p in ("all", "large_pool", "small_pool")}
    return {"allocated_bytes": pools(allocated, peak), "reserved_bytes": pools(reserved, reserved),
            "active_bytes": pools(1, 1), "num_ooms": 0}


@pytest.fixture
def fake_allocator(monkeypatch) -> list:
    """Every read of the allocator's statistics (the flattening readers are refused)."""
    reads = []

    def nested(device=None):
        reads.append(device)
        return _stats(1000 * len(reads), 5000 * len(reads), 8000 * len(reads))

    def flattening(*_, **__):
        raise AssertionError("a per-statistic reader flattens every statistic of the allocator: read them once")

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", nested)
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, flattening)
    return reads


class FakeEvent:
    """torch.cuda.Event on a GPU that runs `lag` events behind the CPU (an event is complete once `lag` more were
    recorded); counts what the recorder asks of it."""

    calls = {"created": 0, "record": 0, "query": 0, "synchronize": 0, "elapsed_time": 0}
    lag = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing, "device_ns needs timing events"
        FakeEvent.calls["created"] += 1
        self.index = None

    def record(self, stream=None) -> None:
        FakeEvent.calls["record"] += 1
        self.index = FakeEvent.calls["record"]

    def query(self) -> bool:
        FakeEvent.calls["query"] += 1
        return FakeEvent.calls["record"] - self.index >= FakeEvent.lag

    def synchronize(self) -> None:
        FakeEvent.calls["synchronize"] += 1

    def elapsed_time(self, end: "FakeEvent") -> float:
        FakeEvent.calls["elapsed_time"] += 1
        return (end.index - self.index) * 1e-3  # ms: 1 us a record between them


@pytest.fixture
def fake_events(monkeypatch) -> dict:
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.calls = dict.fromkeys(FakeEvent.calls, 0)
    FakeEvent.lag = 0
    return FakeEvent.calls


def test_cuda_memory_sample_reads_the_allocator_once(fake_allocator) -> None:
    probe = MemoryProbe("cuda")
    assert probe.sample() == (1000, 5000, 8000), "(allocated now, its peak, reserved)"
    assert probe.sample() == (2000, 10000, 16000)
    assert len(fake_allocator) == 2, "one read of the statistics a sample"


def test_cuda_memory_sample_before_cuda_is_initialised(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: {})  # torch's answer then
    assert MemoryProbe("cuda").sample() == (0, 0, 0)


def test_cuda_clock_polls_and_never_waits_until_the_flush(tmp_path: Path, fake_allocator, fake_events) -> None:
    FakeEvent.lag = 3  # the GPU runs behind: a few spans are still incomplete at each iteration end
    rec = Recorder(0, tmp_path, device="cuda")
    steps = 5
    for _ in range(steps):
        for op in MARKERS:
            rec.marker(op)
    assert fake_events["synchronize"] == 0, "the hot path never waits on the GPU"
    assert fake_events["record"] == 1 + 2 * steps * len(MARKERS), "an event at each boundary of each marker"
    assert fake_events["created"] <= 3 * len(MARKERS), "the resolved spans' events are reused, step after step"
    assert len(fake_allocator) == steps * len(MARKERS), "one read of the allocator a marker"
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        ev = r.read_all().to_pydict()
    assert min(ev["device_ns"]) >= 0, "every span's device time is resolved (the flush waits for the last ones)"
    markers = [i for i, k in enumerate(ev["kind"]) if k == "marker"]
    assert [ev["mem_bytes"][i] for i in markers[:2]] == [1000, 2000]
    assert [ev["mem_reserved_bytes"][i] for i in markers[:2]] == [8000, 16000]
