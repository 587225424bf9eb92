"""Capture frees an op's tensors when the program drops them, as the native backend does (no reference
cycle between a capture work and its future waits for a garbage collection): the allocator's peak memory
in capture is the real run's (tests/gpu/test_memory_oom.py measures it on the GPU)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_prism

pytestmark = pytest.mark.slow

PROGRAM = """
import weakref, torch, torch.distributed as dist
dist.init_process_group("gloo")
freed = []
for kind in ("sync", "async", "future"):
    t = torch.ones(1000)
    ref = weakref.ref(t)
    if kind == "sync":
        dist.all_reduce(t)
    elif kind == "async":
        w = dist.all_reduce(t, async_op=True); w.wait(); del w
    else:
        w = dist.all_reduce(t, async_op=True); fut = w.get_future(); fut.wait(); del w, fut
    del t
    freed.append(f"{kind}={ref() is None}")
print("freed", *freed, flush=True)
"""


def test_capture_frees_op_tensors_at_once(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", str(script)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("freed")]
    assert lines == ["freed sync=True async=True future=True"] * 2, proc.stdout
