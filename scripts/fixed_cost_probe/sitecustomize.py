"""A timing probe for `scripts/fidelity_fixed_cost.py`: where a prism process's wall goes before and after the
program's measured steps. Does nothing unless PRISM_COST_PROBE names a log file
(read at each mark), or PRISM_COST_PROBE_TEMPLATE is set (a zygote template: its forks get the log's name later).

On PYTHONPATH after prism's own `sitecustomize` (which chains to this one), so it runs in every Python process of a
launch: the launcher, the zygote, each forked rank. Each mark is one line `pid ppid name monotonic_ns` appended to the
log with one write (atomic among processes). Marks: `site` (this file runs: the interpreter is up), `torch` (torch
imported), `fork` (a process forks: the zygote's ranks), `forked` (in the child), `program`/`program_end` (the rank's
runpy of the program), `init_pg`/`init_pg_end`, `new_group`/`new_group_end`, `destroy`/`destroy_end`
(torch.distributed's), `step_end` (an optimizer step ended), `finish`/`finish_end` (prism's `interception.finish`: the trace written), `exit` (atexit;
not in a rank: it leaves by os._exit), `zygote_main` (a zygote forked from a template starts), `rank_end` (the rank returns to the zygote's fork loop).
"""

import os
import sys
import time

def _mark(name: str) -> None:
    log = os.environ.get("PRISM_COST_PROBE")  # read at each mark: a zygote forked from a template gets it late
    if not log:
        return
    line = f"{os.getpid()} {os.getppid()} {name} {time.monotonic_ns()}\n".encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _timed(owner, attr: str, name: str) -> None:
    """Wrap owner.attr so that each call is marked `name` before and `name_end` after."""
    fn = getattr(owner, attr, None)
    if fn is None or getattr(fn, "_cost_probe", False):
        return

    def wrapper(*args, **kwargs):
        _mark(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(name + "_end")

    wrapper._cost_probe = True
    wrapper.__wrapped__ = fn
    setattr(owner, attr, wrapper)


_STEP_HOOK: list = []


def _in_child() -> None:
    _mark("forked")
    import runpy

    _timed(runpy, "run_module", "program")
    _timed(runpy, "run_path", "program")
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        for attr, name in (("init_process_group", "init_pg"), ("new_group", "new_group"),
                           ("destroy_process_group", "destroy")):
            _timed(dist, attr, name)
    interception = sys.modules.get("prism.runtime.interception")
    if interception is not None:
        _timed(interception, "finish", "finish")
    optimizer = sys.modules.get("torch.optim.optimizer")
    if optimizer is not None and not _STEP_HOOK:  # every optimizer step's end (moe_gpt: one step an iteration)
        optimizer.register_optimizer_step_post_hook(lambda *_: _mark("step_end"))
        _STEP_HOOK.append(True)  # (a fork of this process has it already)
    zygote = sys.modules.get("prism.runtime.launch.zygote")  # a zygote forked from a template runs its main
    if zygote is not None:
        _timed(zygote, "main", "zygote_main")
    forked_rank = sys.modules.get("prism.runtime.launch.forked_rank")
    if forked_rank is not None:
        fn = forked_rank.run_rank

        def run_rank(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                _mark("rank_end")

        forked_rank.run_rank = run_rank


class _MarkTorchImported:
    """A meta-path finder that marks the end of `import torch` (the spec is the other finders')."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _mark("torch")

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("PRISM_COST_PROBE") or os.environ.get("PRISM_COST_PROBE_TEMPLATE"):
    _mark("site")
    import atexit

    atexit.register(_mark, "exit")
    os.register_at_fork(before=lambda: _mark("fork"), after_in_child=_in_child)
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _MarkTorchImported())

# chain to the next sitecustomize on the path after this folder (prism's, before it, chained to this one)
_here = os.path.dirname(os.path.abspath(__file__))
_dirs = [os.path.abspath(p or ".") for p in sys.path]
_rest = sys.path[_dirs.index(_here) + 1:] if _here in _dirs else []
if _rest:
    import importlib.machinery
    import importlib.util

    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.origin:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
