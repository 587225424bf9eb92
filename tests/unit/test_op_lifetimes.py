"""An op's tensors live as long as the program keeps them, as with the native backend (memory fidelity:
the caching allocator's peak must not depend on prism holding them): the hang watchdog keeps only weak
references to the works it watches."""

from __future__ import annotations

import gc
import weakref

import torch

from prism.runtime.watchdog import Watchdog


class _Store:
    def set(self, key, value):
        pass


class _Group:
    _name, _desc, _global_ranks = "0", "default", [0, 1]


class _Work:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def is_completed(self) -> bool:
        return True


def test_watchdog_does_not_keep_a_works_tensors() -> None:
    dog = Watchdog(_Store(), 0, 2, 1000.0, None)
    try:
        t = torch.ones(8)
        ref = weakref.ref(t)
        work = _Work(t)
        dog.issued(_Group(), work, "all_reduce", 0, -1, 0, "float32", "8")
        del t, work
        assert ref() is None  # freed at once, before the watchdog's thread looked at it
        gc.collect()
        dog._check()          # a freed work is no longer outstanding
        assert dog.pending == []
    finally:
        dog.done = True
