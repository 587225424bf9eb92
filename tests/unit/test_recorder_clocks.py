"""The recorder's clocks: a span that changes thread has no CPU time (-1, never a negative number), an
event whose clock runs backwards is an error naming the rank and the event, and the graph stage refuses
a raw stream holding a negative duration."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from prism import graph, schemas
from prism.runtime.recorder import NegativeDuration, Recorder
from rawgen import megatron_job


def read(rec: Recorder) -> dict:
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        return r.read_all().to_pydict()


def test_span_across_threads_has_unknown_cpu_time(tmp_path: Path) -> None:
    rec = Recorder(0, tmp_path)
    rec.marker("fwd_begin")  # ends on the main thread
    sum(range(200_000))  # compute on the main thread: measured
    rec.marker("fwd_end")
    worker = threading.Thread(target=lambda: rec.marker("bwd_begin"))  # torch's CUDA backward thread
    worker.start()
    worker.join()
    ev = read(rec)
    compute = [(c, d) for k, c, d in zip(ev["kind"], ev["cpu_ns"], ev["device_ns"]) if k == "compute"]
    assert compute[0][0] > 0 and compute[0][1] == compute[0][0], "CPU: device_ns is the thread CPU time"
    assert compute[-1] == (-1, -1), "a span begun on one thread and ended on another is not measured"
    assert min(ev["cpu_ns"]) >= -1 and min(ev["device_ns"]) >= -1
    assert ev["mem_reserved_bytes"][ev["kind"].index("marker")] == -1, "no allocator on CPU"


def test_event_ended_on_another_thread_is_an_error(tmp_path: Path) -> None:
    rec = Recorder(3, tmp_path)
    start = rec.begin()
    start = (start[0] + 10**15, start[1], start[2])  # a start after the end: the clock ran backwards
    with pytest.raises(NegativeDuration, match=r"rank 3: event seq \d+ \(collective all_reduce\)"):
        rec.end(start, schemas.KIND_COLLECTIVE, "all_reduce")


@pytest.mark.parametrize("column,value", [("cpu_ns", -5), ("device_ns", -1_200_000_000), ("t_end_ns", -1)])
def test_graph_refuses_negative_durations(tmp_path: Path, capsys, column: str, value: int) -> None:
    job = megatron_job(tp=2, dp=2, iterations=1)
    event = next(e for e in job.events[1] if e["kind"] == "compute")
    event[column] = value
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"event seq {event['seq']} of rank 1" in err and "negative duration" in err, err
    assert not (tmp_path / "graph").exists()
