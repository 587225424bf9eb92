"""Make the zygote's objects immortal before the ranks fork, so that the ranks stop writing (and so copying)
the pages their reference counts sit on (issue 12 item 1).

A forked rank's private memory is almost all pages of the zygote it wrote, and the first of those writes is
the interpreter's own bookkeeping: every function call, attribute load and constant touches the reference
count of a code object, a function, a descriptor, a tuple of constants. CPython 3.12 (PEP 683) has immortal
objects: on a 64-bit build an object whose low 32 bits of `ob_refcnt` are all set is never counted again
(`Py_INCREF` saturates there, `Py_DECREF` returns on a negative 32-bit count) and never freed. So in the
zygote, after its warm-up and its last `gc.collect()`, every object reachable from the garbage collector's
lists (and what they reach: strings, bytes, ints, code objects' constants, static types' dicts) gets that
count; in the ranks those pages then stay shared.

What it costs: those objects are never freed, in the zygote or a rank (they were alive at the fork anyway;
nothing prism's zygote holds needs freeing: its sockets, pipes and the store are made after this), and a
weak reference to one of them never dies. An object whose last reference goes away in a rank stays in
memory instead of being freed (and its page is not written). Anything that reads exact reference counts
(`sys.getrefcount`, in-place resize of a string whose count is 1) sees a huge count and takes its general
path.

Where it is not available (CPython < 3.12, a free-threaded build, not a 64-bit build, not CPython) or
turned off (`PRISM_IMMORTAL=0`), `immortalise()` changes nothing and says why in its result.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import sysconfig
import time
import types

from prism import settings

ENV = settings.IMMORTAL.name  # "0": leave the zygote's objects mortal (for comparisons)
_COUNT = ctypes.c_ssize_t


def immortal_refcnt() -> int | None:
    """The reference count that makes an object immortal on this interpreter, or None where there is none
    that prism may set (see `unavailable`)."""
    if unavailable() is not None:
        return None
    # 3.12, 3.13: all low 32 bits set (Include/object.h _Py_IMMORTAL_REFCNT = UINT_MAX); 3.14 moved the
    # initial value to 3 << 30 (Include/refcount.h _Py_IMMORTAL_INITIAL_REFCNT), also >= 2**31 as a 32-bit
    # count, which is what both versions test
    return 0xFFFFFFFF if sys.version_info < (3, 14) else 3 << 30


def unavailable(version: tuple = tuple(sys.version_info[:2]), implementation: str = sys.implementation.name,
                free_threaded: bool | None = None, pointer_bits: int | None = None) -> str | None:
    """Why immortalising is not done here (None: it is). Pure, for the tests."""
    if free_threaded is None:
        free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    if pointer_bits is None:
        pointer_bits = ctypes.sizeof(ctypes.c_void_p) * 8
    if implementation != "cpython":
        return f"{implementation} is not CPython"
    if tuple(version) < (3, 12):
        return f"Python {version[0]}.{version[1]} has no immortal objects (PEP 683: CPython 3.12+)"
    if free_threaded:
        return "a free-threaded build counts references in two fields"
    if pointer_bits != 64:
        return f"a {pointer_bits}-bit build"
    return None


def refcnt(obj: object) -> int:
    """The raw `ob_refcnt` field of `obj` (CPython: the first word of the object)."""
    return _COUNT.from_address(id(obj)).value


def _extras(obj: object) -> list:
    """What the garbage collector's traversal does not reach from `obj` but the interpreter touches: a code
    object's constants and names (code objects have no traversal), a static type's dict and bases."""
    if type(obj) is types.CodeType:
        return [obj.co_consts, obj.co_names, obj.co_filename, obj.co_name, obj.co_qualname]
    if isinstance(obj, type) and not obj.__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: heap types traverse
        return [obj.__dict__, *obj.__dict__.values(), obj.__mro__, obj.__bases__]
    return []


def reachable(roots: list, visit) -> int:
    """Breadth-first walk from `roots` through `gc.get_referents` and `_extras`, calling `visit(obj)` once
    per object; `visit` returns False for an object already done (not walked again). Returns how many
    objects `visit` accepted."""
    done = 0
    frontier = list(roots)
    while frontier:
        fresh = [o for o in frontier if visit(o)]
        done += len(fresh)
        frontier = gc.get_referents(*fresh)
        frontier += set(map(type, fresh))
        for o in fresh:
            if type(o) is types.CodeType or isinstance(o, type):
                frontier += _extras(o)
    return done


def immortalise(roots: list | None = None) -> dict:
    """Make every object reachable from `roots` (default: all objects the garbage collector tracks)
    immortal. Returns what was done: {"objects": N, "seconds": s} or {"skipped": why}. Call it after the
    last `gc.collect()` and before `gc.freeze()` (a frozen object is no longer in `gc.get_objects()`)."""
    if not settings.IMMORTAL.get():
        return {"skipped": f"turned off ({ENV}=0)"}
    value = immortal_refcnt()
    if value is None:
        return {"skipped": unavailable()}
    probe = [object()]
    _COUNT.from_address(id(probe[0])).value = value
    copies = probe * 3  # three more references: an immortal count does not move
    if refcnt(copies[0]) != value:
        return {"skipped": f"this interpreter counts references to an immortal object ({refcnt(copies[0]):#x})"}
    started = time.perf_counter()
    threshold = 1 << 31

    def visit(obj: object) -> bool:
        cell = _COUNT.from_address(id(obj))
        if cell.value & 0xFFFFFFFF >= threshold:  # immortal already (None, small ints, interned strings, done)
            return False
        cell.value = value
        return True

    objects = reachable(gc.get_objects() if roots is None else roots, visit)
    return {"objects": objects, "seconds": round(time.perf_counter() - started, 3)}
