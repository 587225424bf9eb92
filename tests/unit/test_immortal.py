"""`prism.runtime.launch.immortal`: which objects the zygote makes immortal, where it does nothing (and says why), and,
where a CPython 3.12+ is at hand, that a forked child then writes fewer of the parent's pages."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from prism.runtime.launch import immortal
from tests.conftest import PROGRAMS, REPO


def test_where_it_is_available():
    assert immortal.unavailable((3, 12), "cpython", False, 64) is None
    assert immortal.unavailable((3, 13), "cpython", False, 64) is None
    assert "3.11" in immortal.unavailable((3, 11), "cpython", False, 64)
    assert "PEP 683" in immortal.unavailable((3, 10), "cpython", False, 64)
    assert "free-threaded" in immortal.unavailable((3, 13), "cpython", True, 64)
    assert "32-bit" in immortal.unavailable((3, 12), "cpython", False, 32)
    assert "not CPython" in immortal.unavailable((3, 12), "pypy", False, 64)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the no-op of interpreters without immortal objects")
def test_before_3_12_it_is_a_reported_no_op():
    obj = ["x"]
    before = immortal.refcnt(obj)
    result = immortal.immortalise([obj])
    assert result == {"skipped": f"Python 3.{sys.version_info[1]} has no immortal objects (PEP 683: CPython 3.12+)"}
    assert immortal.refcnt(obj) == before
    assert immortal.immortal_refcnt() is None


def test_turned_off(monkeypatch):
    monkeypatch.setenv(immortal.ENV, "0")
    assert immortal.immortalise([["x"]]) == {"skipped": "turned off (PRISM_IMMORTAL=0)"}


def _outer():
    def inner():
        return ("inner-const", 7.5)

    return inner, ("outer-const", frozenset({"f"}))


class _Static:
    pass


def test_the_walk_reaches_constants_nested_code_and_types():
    seen: dict[int, object] = {}

    def visit(obj):
        # (modules and their namespaces are not entered: through the function's globals the walk would reach
        # the whole process, and its tens of MiB of bookkeeping would move this process's malloc thresholds
        # for the tests after it)
        if id(obj) in seen or isinstance(obj, types.ModuleType) or isinstance(obj, dict) and "__name__" in obj:
            return False
        seen[id(obj)] = obj
        return True

    count = immortal.reachable([_outer], visit)
    assert count < 20_000, count
    assert count == len(seen)
    code = _outer.__code__
    inner_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    consts = [c for c in inner_code.co_consts if isinstance(c, tuple)][0]
    for obj in (code, code.co_consts, inner_code, inner_code.co_consts, consts, consts[1], consts[0],
                code.co_filename, type(_outer), types.FunctionType.__dict__["__get__"]):
        assert id(obj) in seen, obj
    # a static type's methods are reached through its dict (static types are not traversed by the gc)
    assert id(str.__dict__["join"]) in seen or id(type) in seen


def _python312() -> str | None:
    """This interpreter if it is 3.12+, else another CPython 3.12+ found on the machine (pyenv's shims are
    tried too: each candidate is asked for its version)."""
    if sys.version_info >= (3, 12):
        return sys.executable
    candidates = sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3")) + \
        [p for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p]
    for python in candidates:
        try:
            proc = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                  capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if proc.returncode == 0 and proc.stdout.strip() == "True":
            return python
    return None


def _probe(python: str, enabled: bool) -> dict:
    env = dict(os.environ, PRISM_IMMORTAL="1" if enabled else "0")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([python, str(PROGRAMS / "immortal_probe.py"), str(REPO)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(_python312() is None, reason="needs a CPython 3.12+ interpreter")
def test_a_forked_child_writes_fewer_of_the_parents_pages():
    python = _python312()
    off = min((_probe(python, False) for _ in range(2)), key=lambda r: r["grown_kib"])
    on = min((_probe(python, True) for _ in range(2)), key=lambda r: r["grown_kib"])
    assert off["immortalise"] == {"skipped": "turned off (PRISM_IMMORTAL=0)"}
    assert on["immortalise"]["objects"] > 5000, on
    assert on["code_refcnt"] == 0xFFFFFFFF and off["code_refcnt"] < 100, (on, off)
    # measured on CPython 3.12.1: ~1370 KiB without, ~780 KiB with
    assert on["grown_kib"] < 0.8 * off["grown_kib"], (on, off)
