"""Installed on PYTHONPATH by `prism launch`: routes every process group through prism's backend.

Does nothing unless PRISM_MODE is set, so a stray PYTHONPATH entry is harmless. Chains to the next
`sitecustomize` on the path, if the environment had one.
"""

import os
import sys

if os.environ.get("PRISM_MODE"):
    # Install the interception once the program has imported torch, not before: a Python subprocess
    # that never uses torch (a tool, a helper) then starts as fast as without prism.
    import importlib.abc
    import importlib.machinery

    _TARGET = "torch"

    class _InstallAfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != _TARGET:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                sys.modules[name] = module  # interception imports the finished module
                from prism.runtime import interception

                interception.install_from_env()

            spec.loader.exec_module = exec_module
            return spec

    if _TARGET in sys.modules:
        from prism.runtime import interception

        interception.install_from_env()
    else:
        sys.meta_path.insert(0, _InstallAfterImport())

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
if _rest != sys.path:
    import importlib.machinery
    import importlib.util

    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.origin and os.path.dirname(_spec.origin) != _here:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
