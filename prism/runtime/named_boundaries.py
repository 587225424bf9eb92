"""Boundaries a user names: a function whose outermost call is one iteration (or one microbatch).

For a program the default rules do not fit (no optimizer: inference or evaluation loops; an unusual
loop), `prism launch --iteration-fn MODULE:QUALNAME` (`--microbatch-fn`), or the job config's
`workload.iteration_fn` / `workload.microbatch_fn`, name a function; the launcher passes it to the ranks
as `PRISM_ITERATION_FN` / `PRISM_MICROBATCH_FN`. The function is wrapped where it is defined, when its
module is imported (an import hook; at once when it already is), so no line of the program changes.

The hooks are installed when the program creates its first process group. A module imported by then is
wrapped at once (torchtitan's `torchtitan.trainer:Trainer.train_step`); one imported later, on import; the
program's own functions (`__main__:train_step` for a script; `-m MODULE` runs MODULE as `__main__`) must
be defined by then (a module-level function or class is) and called through the module's namespace (a
global lookup, as `train_step(...)` or `self.train_step(...)` are).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import re
import sys

from prism import settings

ITERATION_ENV = settings.ITERATION_FN.name
MICROBATCH_ENV = settings.MICROBATCH_FN.name

ITERATION_RULE = "outermost optimizer step"  # the default rules of prism.runtime.markers
MICROBATCH_RULE = "forward of a module with trainable parameters (a pipeline stage's: once per schedule chunk)"

_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class BoundaryNameError(ValueError):
    """A named boundary function that cannot be hooked (the message says why and how to fix it)."""


def rules(env=None) -> dict[str, str]:
    """{"iteration": rule, "microbatch": rule} in force for ranks started with environment `env`."""
    env = os.environ if env is None else env
    it, mb = env.get(ITERATION_ENV), env.get(MICROBATCH_ENV)
    return {"iteration": f"function {it}" if it else ITERATION_RULE,
            "microbatch": f"function {mb}" if mb else MICROBATCH_RULE}


def check(name: str, option: str) -> tuple[str, str]:
    """(module, qualname) of `name` ("MODULE:QUALNAME"), or BoundaryNameError naming `option`."""
    if not _NAME.match(name or ""):
        raise BoundaryNameError(f"{option} {name!r}: name a function as MODULE:QUALNAME "
                                "(e.g. torchtitan.trainer:Trainer.train_step)")
    module, qualname = name.split(":")
    return module, qualname


def hook(name: str, option: str, enter, leave) -> None:
    """Call `enter()` before and `leave(result)` after each call of the function `name` ("MODULE:QUALNAME")
    that is not nested in another call of it; wraps it now if its module is imported, else on import."""
    module, qualname = check(name, option)
    main = sys.modules.get("__main__")
    if main is not None and module == getattr(getattr(main, "__spec__", None), "name", None):
        module = "__main__"  # the program runs as `-m MODULE`: its functions live in __main__
    on_import(module, lambda mod: _wrap(mod, qualname, name, option, enter, leave))


def on_import(module: str, after) -> None:
    """`after(mod)` for the module named `module`: now if it is imported, else once its code has run."""
    if module in sys.modules:
        after(sys.modules[module])
    else:
        sys.meta_path.insert(0, _Finder(module, after))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for `module`, it lets the other finders find it and wraps its loader's
    `exec_module`, so that `after(module)` runs once the module's code has run."""

    def __init__(self, module: str, after) -> None:
        self.module, self.after = module, after

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # once; and find the real spec without finding ourselves
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, after = spec.loader.exec_module, self.after

        def exec_module(mod):
            run(mod)
            after(mod)

        spec.loader.exec_module = exec_module
        return spec


def _wrap(module, qualname: str, name: str, option: str, enter, leave) -> None:
    *path, last = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            break
    raw = inspect.getattr_static(owner, last, None) if owner is not None else None
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    fn = raw.__func__ if kind is not None else raw
    if not callable(fn):
        raise BoundaryNameError(f"{option} {name!r}: module {module.__name__} has no function {qualname} "
                                "(check the name: MODULE:QUALNAME, e.g. torchtitan.trainer:Trainer.train_step)")
    depth = [0]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        outer = depth[0] == 0
        depth[0] += 1
        try:
            if outer:
                enter()
            result = fn(*args, **kwargs)
        finally:
            depth[0] -= 1
        if outer:
            leave(result)
        return result

    setattr(owner, last, kind(wrapper) if kind is not None else wrapper)
