"""Zero-code markers: iteration, microbatch and backward boundaries from global hooks.

The rules (`named_boundaries.rules`; the launcher writes the ones in force into the run's meta.json, the graph into
`ranks.iteration_rule` / `ranks.microbatch_rule`):
- iteration: one *outermost* optimizer step ends it (`iteration_end`). A step called from inside another
  step (torchtitan's `OptimizersContainer`, Megatron's chained optimizers: an `Optimizer` whose `step()`
  calls the inner ones') is not a boundary; outermost steps that follow each other with no microbatch
  forward between them (one optimizer per model part, as pipeline stages have) end one iteration: the
  earlier one's marker becomes an `optimizer_step` marker and the events after it return to its iteration
  (`Recorder.reopen_iteration`). A program that runs no module forward at all keeps one iteration a step.
- microbatch: the forward of a module that has trainable parameters, not nested in another module's
  forward (depth 0 -> 1), not a part of a module counted before (a model's output layer called by a loss
  outside the model's forward) and not re-run by a backward (activation checkpointing): `fwd_begin` /
  `fwd_end`.
  FSDP2 units, checkpoint wrappers and pipeline stages calling their sub-modules are all inside it; a
  loss module outside the model has no parameters and is not a microbatch.
  A `torch.distributed.pipelining` stage's module is counted by its schedule: its forward is microbatch k
  when the schedule runs it for chunk k (`forward_one_chunk`), and a rank with several stages (interleaved
  schedules) runs each microbatch once in each: the first of them marks it, the others' events carry its
  number. A stage's forward outside a chunk (the schedule's first-step shape/metadata inference) is none.
- the first gradient reaching that forward's output starts its backward (`bwd_begin`); a callback queued
  on the autograd engine at that moment runs when the backward pass ends (`bwd_end`).
- named: `PRISM_ITERATION_FN` / `PRISM_MICROBATCH_FN` (`prism launch --iteration-fn/--microbatch-fn`,
  `prism.runtime.named_boundaries`) replace the iteration (microbatch) rule by the outermost calls of a
  function the user names.
The hooks are hidden from Dynamo (`torch.compiler.disable`; the module hooks only while Dynamo traces, so that an
eager forward pays no wrapper): a step or a forward inside a compiled region runs them eagerly, at the point
where they fire in the eager program.

The same hooks serve capture mode's drain points (`on_boundary`): the end of a backward pass and the start
of an outermost optimizer step, where torch may wait on futures of ops prism must complete first.
"""

from __future__ import annotations

import functools
import threading
import weakref

import torch
from torch.nn.modules.module import _global_forward_hooks as _POST_HOOKS
from torch.nn.modules.module import _global_forward_pre_hooks as _PRE_HOOKS
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from prism import settings
from prism.runtime import named_boundaries
from prism.runtime.launch import progress
from prism.runtime.recorder import Recorder

_state = threading.local()


class _NoRecorder:
    """Stands in for a Recorder when only the boundary callbacks are wanted."""

    microbatch = -1
    iteration = 0

    def marker(self, op: str) -> None:
        pass

    def reopen_iteration(self) -> bool:
        return True


def _get(name: str) -> int:
    return getattr(_state, name, 0)


_ROOTS: weakref.WeakSet = weakref.WeakSet()  # modules whose forward was a microbatch
_INSIDE: weakref.WeakSet = weakref.WeakSet()  # their sub-modules
_STAGES: weakref.WeakSet = weakref.WeakSet()  # the modules of torch.distributed.pipelining stages
_WATCHING: list = []  # the pipelining stage watch is registered (once a process)
LIFT = True  # an outermost forward takes the global module hooks out while it runs (`install`); tests compare with False


def _trains(module) -> bool:
    """A microbatch root: a module with trainable parameters that is not a part of an earlier root (a
    framework that calls the model's output layer from its loss, chunk by chunk, runs that layer outside
    the model's forward: torchtitan's ChunkedLossWrapper)."""
    if module in _ROOTS:
        return True
    if module in _INSIDE or not any(p.requires_grad for p in module.parameters()):
        return False
    _ROOTS.add(module)
    _INSIDE.update(m for m in module.modules() if m is not module)
    return True


def _watch_pipeline_stages(stage_module) -> None:
    """Make each pipelining stage's module known (`_STAGES`) and its schedule's chunk number visible to
    the hooks (`_state.chunk`, set while `forward_one_chunk` runs); once per process."""
    base = getattr(stage_module, "_PipelineStageBase", None)
    if base is None or not hasattr(base, "forward_one_chunk") or getattr(base.forward_one_chunk, "_prism_chunk", False):
        return  # a torch without it (before 2.4) keeps the rule of root modules; or it is wrapped already
    init, forward_one_chunk = base.__init__, base.forward_one_chunk

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _STAGES.add(self.submod)

    def chunk(self, fwd_chunk_id, *args, **kwargs):
        _STAGES.add(self.submod)
        saved, _state.chunk = getattr(_state, "chunk", None), fwd_chunk_id
        try:
            return forward_one_chunk(self, fwd_chunk_id, *args, **kwargs)
        finally:
            _state.chunk = saved

    chunk._prism_chunk = True
    base.__init__, base.forward_one_chunk = functools.wraps(init)(__init__), functools.wraps(forward_one_chunk)(chunk)


def install(rec: Recorder | None, on_boundary=None) -> list:
    """Install the global hooks that mark `rec`'s stream (and call `on_boundary()` at the end of each
    backward pass and before each outermost optimizer step); returns their handles."""
    rec = rec if rec is not None else _NoRecorder()
    named_it = settings.ITERATION_FN.raw()
    named_mb = settings.MICROBATCH_FN.raw()
    seen = {"forward": False}  # the rank ran a microbatch forward (else every step is its own iteration)
    chunks: set = set()  # the pipeline chunks this iteration has begun

    def begin_microbatch(number: int | None = None) -> None:
        seen["forward"] = True
        rec.microbatch = rec.microbatch + 1 if number is None else number
        rec.marker("fwd_begin")

    def stage_forward(chunk) -> str:
        """How a pipeline stage's forward counts: "microbatch" (chunk `chunk`'s first forward on the rank),
        else "drain" (another stage's forward of that chunk, or the metadata inference outside any chunk)."""
        if chunk is None:
            return "drain"
        if chunk in chunks:
            rec.microbatch = chunk
            return "drain"
        chunks.add(chunk)
        begin_microbatch(chunk)
        return "microbatch"

    def end_microbatch(output) -> None:
        rec.marker("fwd_end")
        first = _first_grad_tensor(output)
        if first is not None:
            mb = rec.microbatch
            first.register_hook(lambda grad: _bwd_begin(rec, mb, on_boundary))

    def end_iteration(merge: bool) -> None:
        if merge and seen["forward"] and rec.microbatch == -1 and rec.iteration > 0:
            rec.reopen_iteration()  # another optimizer of the same iteration: one boundary, at its end
        rec.marker("iteration_end")
        rec.iteration += 1
        rec.microbatch = -1
        chunks.clear()
        progress.note_iteration(rec.iteration)

    # Forwards run by a backward (activation checkpointing's recomputation) are left out entirely: a
    # non-reentrant checkpoint stops its recomputation with an exception once it has what it needs, so
    # their post-hooks may never run.
    def pre_body(module, args):
        if torch._C._current_graph_task_id() != -1:
            return
        depth = _get("depth")
        _state.depth = depth + 1
        if depth == 0 and not named_mb and module in _STAGES:
            _trains(module)
            _state.counted = stage_forward(getattr(_state, "chunk", None))
        elif depth == 0 and not named_mb and _trains(module):
            _state.counted = "microbatch"
            begin_microbatch()
        elif depth == 0:
            _state.counted = None

    def post_body(module, args, output):
        if torch._C._current_graph_task_id() != -1:
            return
        _state.depth = _get("depth") - 1
        if _state.depth != 0:
            return
        counted, _state.counted = getattr(_state, "counted", None), None
        if counted == "microbatch":
            end_microbatch(output)
        elif counted == "drain" and on_boundary is not None:
            first = _first_grad_tensor(output)
            if first is not None:  # its backward ends a backward pass, a drain point as a microbatch's is
                first.register_hook(lambda grad: torch.autograd.Variable._execution_engine.queue_callback(on_boundary))

    # The module hooks run on every module forward: in eager mode as plain calls (Dynamo's disable wrapper costs
    # several us a call); when Dynamo traces a forward, `is_compiling()` is true there and the disabled copy is
    # what it meets, so the body runs eagerly where the hook fires, as in the eager program.
    pre_hidden, post_hidden = torch.compiler.disable(pre_body), torch.compiler.disable(post_body)
    is_compiling = torch.compiler.is_compiling

    # While an outermost (depth 0) eager forward runs, the modules it calls are nested: nothing prism marks. So
    # its pre-hook takes prism's two global module hooks out of torch's dicts (the nested calls then cost what
    # they cost without prism: torch's hook-free path, no Python call) and ends that forward with a hook on
    # that module alone, which puts them back and removes itself (torch iterates a snapshot of both dicts, so
    # neither change touches the call in progress). A forward that raises leaves them out until the next
    # optimizer step puts them back. Two limits of lifting: while it lasts, another thread's forward is not seen
    # (before, it counted at its own thread's depth 0), and a root module that calls itself ends its lifted forward
    # at the inner call's end.
    lifted = {"on": True, "local": None}  # prism's hooks are installed (suspend turns this off); the end hook

    def lift(module) -> None:
        _PRE_HOOKS.pop(pre_handle.id, None)
        _POST_HOOKS.pop(post_handle.id, None)
        lifted["local"] = module.register_forward_hook(end_lifted)

    def put_back() -> None:
        local, lifted["local"] = lifted["local"], None
        if local is not None:
            local.remove()
        if lifted["on"]:
            _PRE_HOOKS[pre_handle.id] = pre
            _POST_HOOKS[post_handle.id] = post

    def recover() -> None:
        """A forward raised while the hooks were lifted: nothing of it is open any more."""
        if lifted["local"] is not None:
            put_back()
            _state.depth, _state.counted = 0, None

    def end_lifted(module, args, output):
        put_back()
        post_body(module, args, output)

    def pre(module, args):
        if is_compiling():
            return pre_hidden(module, args)
        pre_body(module, args)
        if LIFT and module._modules and _get("depth") == 1 and lifted["local"] is None and not named_mb:
            lift(module)

    def post(module, args, output):
        return post_hidden(module, args, output) if is_compiling() else post_body(module, args, output)

    @torch.compiler.disable
    def step_pre(optimizer, args, kwargs):
        recover()
        depth = _get("step_depth")
        _state.step_depth = depth + 1
        if depth == 0 and on_boundary is not None:
            on_boundary()

    @torch.compiler.disable
    def step_post(optimizer, args, kwargs):
        _state.step_depth = max(_get("step_depth") - 1, 0)
        if _state.step_depth == 0 and not named_it:
            end_iteration(merge=True)

    def register() -> "_Handles":
        """The four global hooks into torch's dicts; the returned handles' `again()` registers the same functions
        once more (`interception.resume`: no new closures, wrappers or state a switch)."""
        nonlocal pre_handle, post_handle
        lifted["on"] = True
        pre_handle, post_handle = register_module_forward_pre_hook(pre), register_module_forward_hook(post)
        registered = _Handles([
            _Removal(pre_handle, lifted),
            _Removal(post_handle, lifted),
            register_optimizer_step_pre_hook(step_pre),
            register_optimizer_step_post_hook(step_post),
        ])
        registered.again = register
        return registered

    pre_handle = post_handle = None
    handles = register()
    if not named_mb and torch.distributed.is_available() and not _WATCHING:
        _WATCHING.append(True)  # once a process (a second install, after `interception.resume`, adds no finder)
        named_boundaries.on_import("torch.distributed.pipelining.stage", _watch_pipeline_stages)
    if named_it:
        named_boundaries.hook(named_it, "--iteration-fn", lambda: None, lambda result: end_iteration(merge=False))
    if named_mb:
        named_boundaries.hook(named_mb, "--microbatch-fn", begin_microbatch, end_microbatch)
    return handles


class _Handles(list):
    """`install`'s handles; `again()` (set by `install`) puts the same hooks back after they were all removed."""

    again = None


class _Removal:
    """A global module hook's handle whose `remove()` also keeps a lifted hook (`install`) from coming back."""

    def __init__(self, handle, lifted: dict) -> None:
        self.handle, self.lifted = handle, lifted

    def remove(self) -> None:
        self.lifted["on"] = False
        local, self.lifted["local"] = self.lifted["local"], None
        if local is not None:
            local.remove()
        self.handle.remove()


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
