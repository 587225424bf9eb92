"""An out-of-memory error in a rank is a finding, not a prism crash (prism/runtime/oom.py): the supervisor
says plainly which rank ran out where, the launcher writes OUT/oom.json and exits oom.EXIT_CODE, and the
summary states it. On CPU the error is raised by the program (torch.OutOfMemoryError with CUDA's message);
the GPU test (tests/gpu/test_memory_oom.py) meets a real allocator limit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from prism import summary
from prism.runtime import oom
from tests.conftest import run_prism

pytestmark = pytest.mark.slow

PROGRAM = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    for mb in range(2):
        out = model(torch.ones(2, 4))
        if r == 1 and step == 1 and mb == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has ...")
        out.sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad()
"""


@pytest.mark.parametrize("mode", ["real", "capture"])
def test_oom_is_reported_as_a_finding(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "2", "--mode", mode, "--out", str(out), str(script)])
    assert proc.returncode == oom.EXIT_CODE, proc.stderr[-3000:]
    assert ("rank 1 ran out of device memory at iteration 1, microbatch 1 (after fwd_end), asking for "
            "20,971,520 bytes") in proc.stderr, proc.stderr[-3000:]
    assert "not a failure of prism" in proc.stderr
    found = json.loads((out / "oom.json").read_text())
    assert found["exit_code"] == oom.EXIT_CODE and found["world_size"] == 2 and found["mode"] == mode
    (rec,) = found["ooms"]
    assert (rec["rank"], rec["iteration"], rec["microbatch"], rec["phase"], rec["requested_bytes"]) == \
        (1, 1, 1, "fwd_end", 20 * 2**20)
    assert not (out / "raw").exists()  # no half-written trace: the finding is the artifact
    text = summary.summarize(out)
    assert "FINDING: the program ran out of device memory" in text and "rank 1: iteration 1, microbatch 1" in text


PEER_FAILS_FIRST = """
import sys, time, torch, torch.distributed as dist
from prism.runtime import oom
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    time.sleep(1.0)
    sys.exit(1)  # the peer fails first (on a GPU: its gloo connection closed by the rank that ran out)
record = oom.record_failure
def record_then_linger(*args):  # the rank that ran out is still finishing when the peer's exit is reaped
    done = record(*args)
    time.sleep(5)
    return done
oom.record_failure = record_then_linger
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has ...")
"""


def test_oom_is_the_finding_when_a_peer_exits_first(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PEER_FAILS_FIRST))
    out = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "2", "--mode", "real", "--out", str(out), str(script)])
    assert proc.returncode == oom.EXIT_CODE, proc.stderr[-3000:]
    assert "rank 1 ran out of device memory" in proc.stderr and "rank 0 failed" not in proc.stderr
    (rec,) = json.loads((out / "oom.json").read_text())["ooms"]
    assert (rec["rank"], rec["requested_bytes"]) == (1, 2 * 2**20)


def test_rank_memory_limit_needs_cuda(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import torch\n")
    proc = run_prism(["launch", "--nproc", "1", "--rank-memory-gb", "1", str(script)], PRISM_DEVICE="cpu")
    assert proc.returncode == 2 and "set PRISM_DEVICE=cuda" in proc.stderr, proc.stderr[-2000:]
    # told CUDA, but none is usable here: the launcher says so before any rank starts, no traceback
    proc = run_prism(["launch", "--nproc", "1", "--rank-memory-gb", "1", str(script)], PRISM_DEVICE="cuda",
                     CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2 and "PRISM_DEVICE=cuda, but" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
