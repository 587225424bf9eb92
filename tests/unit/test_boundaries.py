"""Iteration and microbatch boundaries (prism/runtime/markers.py, named_boundaries.py) in one process:
nested optimizer steps, several optimizers, gradient accumulation, activation checkpointing, a loss
module, a function the user names; and the graph's check that ranks agree on their iterations."""

from __future__ import annotations

import sys

import polars as pl
import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from prism import schemas
from prism.graph import check_iterations
from prism.graph_matching import GraphError
from prism.runtime import markers, named_boundaries
from prism.runtime.recorder import Recorder

COLS = [f.name for f in schemas.RAW_EVENTS if f.name != "rank"]


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """install(env) -> the Recorder whose markers the global hooks write; the hooks are removed after."""
    handles = []

    def install(**env):
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        rec = Recorder(0, tmp_path / "raw")
        handles.extend(markers.install(rec))
        return rec

    yield install
    for h in handles:
        h.remove()


def _markers(rec) -> list[tuple[str, int, int]]:
    op, it, mb = COLS.index("op"), COLS.index("iteration"), COLS.index("microbatch")
    return [(r[op], r[it], r[mb]) for r in rec.buffered() if r[1] == schemas.KIND_MARKER]


class Container(torch.optim.Optimizer):
    def __init__(self, optimizers):
        self.optimizers = optimizers
        super().__init__([p for o in optimizers for g in o.param_groups for p in g["params"]], {})

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()


class Block(nn.Module):
    def __init__(self, ckpt: bool):
        super().__init__()
        self.lin, self.ckpt = nn.Linear(4, 4), ckpt

    def forward(self, x):
        return checkpoint(self.lin, x, use_reentrant=False) if self.ckpt else self.lin(x)


def _train(model, optimizers, steps=2, accum=2, loss_fn=nn.MSELoss()):
    for _ in range(steps):
        for _ in range(accum):
            loss_fn(model(torch.randn(2, 4)), torch.zeros(2, 4)).backward()
        for o in optimizers:
            o.step()
        for o in optimizers:
            o.zero_grad()


@pytest.mark.parametrize("ckpt", [False, True])
def test_a_container_of_optimizers_is_one_boundary_a_step(recorded, ckpt):
    rec = recorded()
    model = nn.Sequential(Block(ckpt), Block(ckpt))
    inner = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[1].parameters(), lr=0.1)]
    _train(model, [Container(inner)])
    got = _markers(rec)
    assert [m for m in got if m[0] == "iteration_end"] == [("iteration_end", 0, 1), ("iteration_end", 1, 1)]
    assert [m[1:] for m in got if m[0] == "fwd_begin"] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # not the blocks
    assert sum(m[0] == "bwd_end" for m in got) == 4 and rec.iteration == 2


def test_several_optimizers_stepped_in_turn_end_one_iteration(recorded):
    rec = recorded()
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[1].parameters(), lr=0.1)]
    _train(model, opts, steps=3, accum=1)
    got = _markers(rec)
    assert [m[:2] for m in got if m[0] in ("iteration_end", "optimizer_step")] == [
        ("optimizer_step", 0), ("iteration_end", 0), ("optimizer_step", 1), ("iteration_end", 1),
        ("optimizer_step", 2), ("iteration_end", 2)]
    it = COLS.index("iteration")
    assert [r[it] for r in rec.buffered()] == sorted(r[it] for r in rec.buffered())  # never decreases along the rank


def test_without_any_module_forward_every_step_is_an_iteration(recorded):
    rec = recorded()
    w = torch.zeros(3, requires_grad=True)
    opts = [torch.optim.SGD([w], lr=0.1), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)]
    for _ in range(2):
        (w * 2).sum().backward()
        for o in opts:
            o.step()
    assert sum(m[0] == "iteration_end" for m in _markers(rec)) == 4


def test_a_named_function_is_the_boundary(recorded, tmp_path, monkeypatch):
    (tmp_path / "loopmod.py").write_text(
        "def train_step(model, x):\n    return model(x).sum()\n\n"
        "class Trainer:\n    def step(self, model, x):\n        return train_step(model, x) + train_step(model, x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "loopmod", raising=False)
    rec = recorded(PRISM_ITERATION_FN="loopmod:Trainer.step", PRISM_MICROBATCH_FN="loopmod:train_step")
    import loopmod  # imported after the hooks: wrapped on import

    model = nn.Linear(4, 1)
    with torch.no_grad():  # an evaluation loop: no optimizer
        for _ in range(3):
            loopmod.Trainer().step(model, torch.randn(2, 4))
    got = _markers(rec)
    assert [m for m in got if m[0] == "iteration_end"] == [("iteration_end", i, 1) for i in range(3)]
    assert [m[1:] for m in got if m[0] == "fwd_begin"] == [(i, mb) for i in range(3) for mb in (0, 1)]


@pytest.mark.parametrize("name, why", [("nocolon", "MODULE:QUALNAME"), ("a.b:c d", "MODULE:QUALNAME")])
def test_a_badly_named_function_is_refused(name, why):
    with pytest.raises(named_boundaries.BoundaryNameError, match=why):
        named_boundaries.check(name, "--iteration-fn")


def test_a_missing_function_is_named(tmp_path, monkeypatch):
    (tmp_path / "emptymod.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import emptymod

    with pytest.raises(named_boundaries.BoundaryNameError, match="emptymod has no function nope"):
        named_boundaries.hook("emptymod:nope", "--iteration-fn", lambda: None, lambda r: None)


def _ranks(rows):
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "iterations": pl.Int32, "iteration_rule": pl.String},
                        orient="row")


def test_ranks_that_disagree_on_iterations_are_named():
    rule = {"boundaries": {"iteration": "outermost optimizer step"}}
    check_iterations(_ranks([(0, 4, "outermost optimizer step"), (1, 4, "outermost optimizer step")]), rule)
    with pytest.raises(GraphError, match=r"ranks disagree.*\[0, 2\]: 4 .*\[1\]: 8 .*--iteration-fn"):
        check_iterations(_ranks([(0, 4, "a"), (1, 8, "a"), (2, 4, "a")]), rule)
    named = {"boundaries": {"iteration": "function m:f"}}
    with pytest.raises(GraphError, match=r"\[1\]: the iteration boundary function m:f never returned"):
        check_iterations(_ranks([(0, 4, "function m:f"), (1, 1, "none found (events.iteration)")]), named)


def test_a_part_of_the_model_called_by_the_loss_is_not_a_microbatch(recorded):
    """torchtitan's chunked loss runs the model's output layer once a chunk, outside the model's forward."""
    rec = recorded()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.body(x)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        h = net(torch.randn(4, 4))
        loss = sum(net.head(chunk).sum() for chunk in h.chunk(4))  # 4 calls of a part, at depth 0
        loss.backward()
        opt.step()
    got = _markers(rec)
    assert [m[1:] for m in got if m[0] == "fwd_begin"] == [(0, 0), (1, 0)]
    assert sum(m[0] == "iteration_end" for m in got) == 2


@pytest.mark.parametrize("schedule, stages", [("ScheduleGPipe", 1), ("Schedule1F1B", 1),
                                              ("ScheduleInterleaved1F1B", 2)])
def test_a_pipeline_schedule_counts_each_chunk_once_a_rank(recorded, schedule, stages):
    """A microbatch is a chunk of the schedule: once on a rank with two stages (interleaved), and never the
    schedule's first-step metadata inference (a forward and backward of each stage outside any chunk)."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    rec = recorded()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        modules = [nn.Linear(4, 4) for _ in range(stages)]
        parts = [pipelining.PipelineStage(m, i, stages, torch.device("cpu")) for i, m in enumerate(modules)]
        cls = getattr(pipelining, schedule)
        run = cls(parts if stages > 1 else parts[0], 4, loss_fn=nn.MSELoss())
        opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.1)
        for _ in range(2):
            run.step(torch.randn(8, 4), target=torch.zeros(8, 4))
            opt.step()
            opt.zero_grad()
    finally:
        dist.destroy_process_group()
    got = _markers(rec)
    chunks = [(it, mb) for it in range(2) for mb in range(4)]
    assert [m[1:] for m in got if m[0] == "fwd_begin"] == chunks
    assert sorted(m[1:] for m in got if m[0] == "fwd_end") == chunks
    assert sorted(m[1:] for m in got if m[0] == "bwd_end") == chunks
    assert [m for m in got if m[0] == "iteration_end"] == [("iteration_end", 0, 3), ("iteration_end", 1, 3)]
