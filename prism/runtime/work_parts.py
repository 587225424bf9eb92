"""What prism's works share of torch's `Work` interface, written once.

A work of prism is either its own (it completes when prism says so and holds its own result: the
capture's, the emulated sandbox's) or a real backend's work with something added (a recv's sender, a
reduction's captured result). Each kind answers the rest of `Work`'s questions the same way; these mixins
go before `Work` (or alone, for a work torch never sees) in a class's bases.
"""

from __future__ import annotations

import torch


class OwnResult:
    """A work that completes on its own terms (`is_completed`, `wait`) with its result in `_result`: an
    error raises from `wait`, so success is completion and there is never an exception to report."""

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self) -> None:
        self.wait()


class Forwarding:
    """A work that is another work, `_inner`, with something added: every question goes to `_inner`."""

    def wait(self, timeout=None) -> bool:
        return self._inner.wait()

    def get_future(self) -> torch.futures.Future:
        return self._inner.get_future()

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def result(self):
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()
