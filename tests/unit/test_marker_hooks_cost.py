"""The global module hooks that find microbatches (prism/runtime/markers.py) run on every module forward of the
program: in eager mode they are plain calls (Dynamo's `torch.compiler.disable` wrapper costs several us a call,
twice a module: issue 21 item 6), and under torch.compile their body still runs eagerly where it fires."""

from __future__ import annotations

import pickle

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


def _program(rec_dir, lift: bool, monkeypatch, raise_in_forward: bool = False):
    """A few steps of two microbatches, a nested model with a loss module outside it; the marker stream."""
    monkeypatch.setattr(markers, "LIFT", lift)
    rec = Recorder(0, rec_dir)
    handles = markers.install(rec)
    torch.manual_seed(0)
    model = nn.Sequential(_model(), nn.Sequential(nn.Linear(4, 1)))
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    try:
        for step in range(3):
            for _ in range(2):
                x = torch.randn(2, 4)
                if raise_in_forward and step == 1:
                    bad = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 1))  # a shape error inside a nested module
                    with pytest.raises(RuntimeError):
                        bad(x)
                loss_fn(model(x), torch.zeros(2, 1)).backward()
                seen.append((len(torch.nn.modules.module._global_forward_pre_hooks),
                             len(torch.nn.modules.module._global_forward_hooks)))
            opt.step()
            opt.zero_grad()
    finally:
        for h in handles:
            h.remove()
        markers._state.depth, markers._state.counted = 0, None  # unlifted, the raising forward left its depth at 1
    rec.close()
    with pa.ipc.open_stream(str(rec.dir / "events.arrow")) as r:
        ev = r.read_all().to_pydict()
    return [(k, op, it, mb) for k, op, it, mb in zip(ev["kind"], ev["op"], ev["iteration"], ev["microbatch"])], seen


def test_an_outermost_forward_lifts_the_global_hooks_and_the_stream_is_unchanged(tmp_path, monkeypatch):
    lifted, seen = _program(tmp_path / "lifted", True, monkeypatch)
    plain, _ = _program(tmp_path / "plain", False, monkeypatch)
    assert lifted == plain  # every event, marker and compute span, with its iteration and microbatch
    assert [op for k, op, _, _ in plain if k == "marker"] == (
        ["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 2 + ["iteration_end"]) * 3
    assert set(seen) == {(1, 1)}  # between forwards prism's two global module hooks are back, once each
    assert torch.nn.modules.module._global_forward_pre_hooks == {}  # and gone with the handles


def test_inside_an_outermost_forward_no_global_hook_runs_and_the_root_keeps_no_hook(hooked):
    inside = []

    class Probe(nn.Module):
        def forward(self, x):
            inside.append((len(torch.nn.modules.module._global_forward_pre_hooks),
                           len(torch.nn.modules.module._global_forward_hooks)))
            return x

    model = nn.Sequential(nn.Linear(4, 4), Probe())
    model(torch.randn(2, 4))
    assert inside == [(0, 0)]  # the nested modules take torch's hook-free path
    assert len(model._forward_hooks) == 0 and len(model._forward_pre_hooks) == 0
    assert (len(torch.nn.modules.module._global_forward_pre_hooks),
            len(torch.nn.modules.module._global_forward_hooks)) == (1, 1)
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    plain(torch.randn(2, 4))
    pickle.dumps(plain)  # no hook of prism's left on it: `torch.save(model)` pickles the module
    assert _ops(hooked) == ["fwd_begin", "fwd_end"] * 2


def test_a_forward_that_raises_while_lifted_is_recovered_at_the_next_step(tmp_path, monkeypatch):
    lifted, seen = _program(tmp_path / "lifted", True, monkeypatch, raise_in_forward=True)
    plain, _ = _program(tmp_path / "plain", False, monkeypatch, raise_in_forward=True)
    ops = [op for k, op, _, _ in lifted if k == "marker"]
    # lifted: the raising forward (step 2, before its first microbatch) leaves the hooks out until that step's
    # optimizer step, so step 2's two microbatches are not marked; step 3's are
    assert ops == (["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 2 + ["iteration_end"]
                   + ["fwd_begin", "iteration_end"]
                   + ["fwd_begin", "fwd_end", "bwd_begin", "bwd_end"] * 2 + ["iteration_end"])
    assert seen[2:4] == [(0, 0), (0, 0)] and seen[4:] == [(1, 1), (1, 1)]
    # without lifting the raising forward's depth never returns to 0: every later forward is nested
    assert [op for k, op, _, _ in plain if k == "marker"].count("fwd_end") == 2
