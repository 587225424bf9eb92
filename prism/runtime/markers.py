"""Zero-code markers: iteration, microbatch and backward boundaries from global hooks.

- the outermost module's forward (depth 0 -> 1) is one microbatch forward: `fwd_begin` / `fwd_end`;
- the first gradient reaching that forward's output starts its backward (`bwd_begin`); a callback queued
  on the autograd engine at that moment runs when the backward pass ends (`bwd_end`);
- a global optimizer step post-hook ends the iteration (`iteration_end`).
Forwards re-run inside a backward (activation checkpointing) are not counted as microbatches.

The same hooks serve capture mode's drain points (`on_boundary`): the end of a backward pass and the start
of an optimizer step, where torch may wait on futures of ops prism must complete first.
"""

from __future__ import annotations

import threading

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from prism.runtime.launch import progress
from prism.runtime.recorder import Recorder

_state = threading.local()


class _NoRecorder:
    """Stands in for a Recorder when only the boundary callbacks are wanted."""

    microbatch = -1
    iteration = 0

    def marker(self, op: str) -> None:
        pass


def _depth() -> int:
    return getattr(_state, "depth", 0)


def install(rec: Recorder | None, on_boundary=None) -> list:
    """Install the global hooks that mark `rec`'s stream (and call `on_boundary()` at the end of each
    backward pass and before each optimizer step); returns their handles."""
    rec = rec if rec is not None else _NoRecorder()

    def pre(module, args):
        depth = _depth()
        _state.depth = depth + 1
        if depth == 0 and torch._C._current_graph_task_id() == -1:
            rec.microbatch += 1
            rec.marker("fwd_begin")

    def post(module, args, output):
        _state.depth = _depth() - 1
        if _state.depth == 0 and torch._C._current_graph_task_id() == -1:
            rec.marker("fwd_end")
            first = _first_grad_tensor(output)
            if first is not None:
                mb = rec.microbatch
                first.register_hook(lambda grad: _bwd_begin(rec, mb, on_boundary))

    def step(optimizer, args, kwargs):
        rec.marker("iteration_end")
        rec.iteration += 1
        rec.microbatch = -1
        progress.note_iteration(rec.iteration)

    handles = [
        register_module_forward_pre_hook(pre),
        register_module_forward_hook(post),
        register_optimizer_step_post_hook(step),
    ]
    if on_boundary is not None:
        handles.append(register_optimizer_step_pre_hook(lambda *_: on_boundary()))
    return handles


def _bwd_begin(rec, microbatch: int, on_boundary) -> None:
    saved = rec.microbatch
    rec.microbatch = microbatch
    rec.marker("bwd_begin")
    rec.microbatch = saved

    def end():
        saved_end = rec.microbatch
        rec.microbatch = microbatch
        rec.marker("bwd_end")
        rec.microbatch = saved_end
        if on_boundary is not None:
            on_boundary()

    torch.autograd.Variable._execution_engine.queue_callback(end)


def _first_grad_tensor(output):
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        for item in output:
            found = _first_grad_tensor(item)
            if found is not None:
                return found
    return None
