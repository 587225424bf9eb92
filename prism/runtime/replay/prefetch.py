"""Prefetch of recorded payloads into a bounded pool, ahead of the replay ops that send them.

The replay worker knows the order in which its virtual ranks will need payloads (their program order on
the calibrated clock) and gives it to `PayloadPool.schedule`. A loader thread walks that order and loads
each payload while the pool's bytes stay within `capacity_bytes`; `get` returns a loaded payload at once
(a hit) or blocks until it is there (a stall: the replay op waits on its payload); `release` frees it.

- Bytes are reserved before a load from `size_of(key)` (default: the file size at path `key`, which for a
  saved tensor is a little more than its bytes; pass the payload's tensor bytes when known) and settled to
  the loaded tensor's bytes after it, so the pool never holds more than `capacity_bytes`...
- ...except for a payload larger than the whole capacity: the loader waits until the pool is empty, then
  loads it alone (it still loads, in order; `peak_bytes` then shows its size, `oversize` counts it).
- A `get` for a key the loader is loading, or will start next and has room for, waits for it. A `get` for
  any other key (the pool is full of later payloads, or the key was never scheduled) loads it in the caller, outside the pool (`direct`, a stall) and drops its first scheduled use,
  so out-of-order use never deadlocks and never pushes the pool above its capacity.
- `capacity_bytes=0` turns prefetch off: every `get` loads synchronously and counts as a stall.
A key scheduled k times is needed k times: the pool keeps it until it is released k times.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import torch


def _file_size(key: str) -> int:
    return os.path.getsize(key)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _Entry:
    tensor: torch.Tensor | None
    nbytes: int
    uses: int
    error: BaseException | None = None


class PayloadPool:
    """A bounded pool of payloads loaded ahead of use by one loader thread (see the module docstring)."""

    def __init__(self, capacity_bytes: int, load: Callable[[str], torch.Tensor],
                 size_of: Callable[[str], int] | None = None):
        if capacity_bytes < 0:
            raise ValueError(f"prefetch capacity must be >= 0 bytes (0 turns prefetch off), got {capacity_bytes}")
        self.capacity = int(capacity_bytes)
        self._load = load
        self._size_of = size_of or _file_size
        self._cv = threading.Condition()
        self._queue: deque[str] = deque()
        self._resident: dict[str, _Entry] = {}
        self._inflight: str | None = None
        self._bytes = 0
        self._closed = False
        self._stats = dict(stalls=0, stall_s=0.0, hits=0, loaded=0, direct=0, oversize=0, peak_bytes=0)
        self._thread = None
        if self.capacity > 0:
            self._thread = threading.Thread(target=self._loader, name="prism-prefetch", daemon=True)
            self._thread.start()

    # -- consumer side ---------------------------------------------------------------------------------

    def schedule(self, keys: Iterable[str]) -> None:
        """Append `keys` to the order of future use."""
        if self.capacity == 0:
            return
        with self._cv:
            self._queue.extend(keys)
            self._cv.notify_all()

    def get(self, key: str) -> torch.Tensor:
        """The payload of `key`: from the pool (a hit) or after waiting / loading it here (a stall)."""
        t0, waited = time.perf_counter(), False
        with self._cv:
            while True:
                entry = self._resident.get(key)
                if entry is not None:
                    if waited:
                        self._count_stall(t0)
                    else:
                        self._stats["hits"] += 1
                    if entry.error is not None:
                        raise RuntimeError(f"loading payload {key!r} failed: {entry.error}") from entry.error
                    return entry.tensor
                if self._inflight == key or self._loader_takes_next(key):
                    waited = True
                    self._cv.wait()
                    continue
                try:                       # not started: load it here, outside the pool
                    self._queue.remove(key)
                except ValueError:
                    pass
                break
        tensor = self._load(key)
        with self._cv:
            self._stats["direct"] += 1
            self._count_stall(t0)
        return tensor

    def release(self, key: str) -> None:
        """One use of `key` is over; the pool frees it after its last scheduled use."""
        with self._cv:
            entry = self._resident.get(key)
            if entry is None:
                return                     # loaded directly: nothing held
            entry.uses -= 1
            if entry.uses <= 0:
                del self._resident[key]
                self._bytes -= entry.nbytes
                self._cv.notify_all()

    def stats(self) -> dict:
        """stalls, stall_s, hits, loaded (by the loader), direct (by a caller), oversize, peak_bytes,
        resident_bytes, capacity_bytes."""
        with self._cv:
            return dict(self._stats, resident_bytes=self._bytes, capacity_bytes=self.capacity)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "PayloadPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _loader_takes_next(self, key: str) -> bool:
        """Under the lock: `key` heads the schedule and the loader can start it as soon as it is free."""
        if not self._queue or self._queue[0] != key:
            return False
        return self._fits(max(0, int(self._size_of(key))))

    def _fits(self, size: int) -> bool:
        """Room for `size` more bytes, or an oversize payload and an empty pool."""
        return self._bytes + size <= self.capacity or (size > self.capacity and self._bytes == 0)

    def _count_stall(self, t0: float) -> None:
        self._stats["stalls"] += 1
        self._stats["stall_s"] += time.perf_counter() - t0

    # -- loader thread ---------------------------------------------------------------------------------

    def _next(self) -> tuple[str, int] | None:
        """Under the lock: the next key to load and its reserved bytes, once there is room; None when closed."""
        while True:
            if self._closed:
                return None
            if self._queue:
                key = self._queue[0]
                entry = self._resident.get(key)
                if entry is not None:      # needed again while resident: one more use, no load
                    self._queue.popleft()
                    entry.uses += 1
                    continue
                size = max(0, int(self._size_of(key)))
                if self._fits(size):
                    self._queue.popleft()
                    if size > self.capacity:
                        self._stats["oversize"] += 1
                    self._inflight = key
                    self._bytes += size
                    self._stats["peak_bytes"] = max(self._stats["peak_bytes"], self._bytes)
                    return key, size
            self._cv.wait()

    def _loader(self) -> None:
        while True:
            with self._cv:
                nxt = self._next()
            if nxt is None:
                return
            key, reserved = nxt
            tensor, error = None, None
            try:
                tensor = self._load(key)
            except BaseException as e:  # handed to the get() that asks for this key
                error = e
            with self._cv:
                actual = _nbytes(tensor) if tensor is not None else 0
                self._bytes += actual - reserved
                self._resident[key] = _Entry(tensor, actual, 1, error)
                self._inflight = None
                self._stats["loaded"] += 1
                self._stats["peak_bytes"] = max(self._stats["peak_bytes"], self._bytes)
                self._cv.notify_all()
