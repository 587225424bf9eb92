"""The global module hooks that find microbatches (prism/runtime/markers.py) run on every module forward of the
program: in eager mode they are plain calls (Dynamo's `torch.compiler.disable` wrapper costs several us a call,
twice a module: issue 21 item 6), and under torch.compile their body still runs eagerly where it fires."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
import torch._dynamo.eval_frame as eval_frame
import torch.nn as nn

from prism.runtime import markers
from prism.runtime.recorder import Recorder


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(5)])


def _ops(rec: Recorder) -> list[str]:
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        ev = r.read_all().to_pydict()
    return [op for kind, op in zip(ev["kind"], ev["op"]) if kind == "marker"]


@pytest.fixture
def hooked(tmp_path):
    rec = Recorder(0, tmp_path / "raw")
    handles = markers.install(rec)
    yield rec
    for h in handles:
        h.remove()


def test_module_hooks_do_not_switch_dynamo_frames_in_eager_mode(hooked, monkeypatch) -> None:
    switches = []
    original = eval_frame.set_eval_frame
    monkeypatch.setattr(eval_frame, "set_eval_frame", lambda *a: switches.append(a) or original(*a))
    model, x = _model(), torch.randn(2, 4)
    model(x)
    model(x)
    assert switches == [], "a module forward in eager mode runs the hooks as plain calls (16 modules, 2 forwards)"
    assert _ops(hooked) == ["fwd_begin", "fwd_end"] * 2


def test_module_hooks_run_eagerly_inside_a_compiled_forward(hooked) -> None:
    torch._dynamo.reset()
    model, x = _model(), torch.randn(2, 4)
    expected = model(x)
    model.compile(backend="eager")  # Dynamo traces the forward and the hooks it calls
    assert torch.equal(model(x), expected)
    model(x)
    assert _ops(hooked) == ["fwd_begin", "fwd_end"] * 3, "each forward, compiled or not, is one microbatch"
