"""PrismTrace's CUDA clock: a compute segment's `device_ns` is the GPU time of the work queued in it
(CUDA events on the current stream, read lazily), and markers carry the caching allocator's memory."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch

from prism.runtime.recorder import Recorder
from tests.gpu.gpu_env import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]


def matmuls(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = (x @ x) / x.shape[0]
    return x


def test_compute_device_time_is_the_gpu_time(tmp_path: Path) -> None:
    x = torch.randn(4096, 4096, device="cuda")
    matmuls(x, 3)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    matmuls(x, 20)
    b.record()
    b.synchronize()
    reference_ns = a.elapsed_time(b) * 1e6

    rec = Recorder(0, tmp_path, device="cuda")
    rec.marker("fwd_begin")
    y = matmuls(x, 20)  # queued only: the host is back long before the GPU is done
    rec.marker("fwd_end")
    rec.marker("iteration_end")  # resolves what is complete, waits for nothing
    del y
    rec.close()  # waits for the last events
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        ev = r.read_all().to_pydict()
    i = ev["op"].index("fwd_end")
    compute = [k for k in range(i) if ev["kind"][k] == "compute"][-1]
    got = ev["device_ns"][compute]
    assert 0.8 * reference_ns <= got <= 1.25 * reference_ns, (got, reference_ns)
    host_ns = ev["t_end_ns"][compute] - ev["t_start_ns"][compute]
    assert host_ns < got, "the host only queued the kernels: the device time is the GPU's, not the host's"
    assert min(ev["device_ns"]) >= 0
    for k in (k for k, kind in enumerate(ev["kind"]) if kind == "marker"):
        assert ev["mem_bytes"][k] >= x.numel() * 4
        assert ev["mem_peak_bytes"][k] >= ev["mem_bytes"][k] and ev["mem_reserved_bytes"][k] >= ev["mem_bytes"][k]
