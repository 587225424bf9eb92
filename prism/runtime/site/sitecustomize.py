"""Installed on PYTHONPATH by `prism launch`: routes every process group through prism's backend.

Does nothing unless PRISM_MODE is set, so a stray PYTHONPATH entry is harmless. Chains to the next
`sitecustomize` on the path, if the environment had one.
"""

import os
import sys

if os.environ.get("PRISM_MODE"):
    from prism.runtime import interception

    interception.install_from_env()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
if _rest != sys.path:
    import importlib.machinery
    import importlib.util

    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.origin and os.path.dirname(_spec.origin) != _here:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
