"""The ranks' stdout and stderr, forwarded by the zygote: whole lines at a time (so lines of different ranks
never mix), optionally also appended to a rank's log file. The same selector serves the capture's control
sockets (`coordinator_link`), whose handlers it calls."""

from __future__ import annotations

import os
import selectors
import time


class Tee:
    """A forwarding sink that also appends to a rank's log file (mode emulate: OUT/logs/rank=R.log)."""

    def __init__(self, sink, log) -> None:
        self.sink, self.log = sink, log

    def write(self, data: bytes) -> None:
        self.sink.write(data)
        self.log.write(data)

    def flush(self) -> None:
        self.sink.flush()
        self.log.flush()


class LineForwarder:
    """Forwards the ranks' stdout/stderr whole lines at a time, so lines of different ranks never mix."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.partial: dict[int, bytes] = {}
        self.before_write = lambda: None  # e.g. wipe a progress line from the terminal

    def add(self, fd: int, sink) -> None:
        self.sel.register(fd, selectors.EVENT_READ, sink)
        self.partial[fd] = b""

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            fd, sink = key.fd, key.data
            if callable(sink):  # a control socket: its handler reads it
                sink()
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                self._close(fd, sink)
                continue
            buf = self.partial[fd] + data
            cut = buf.rfind(b"\n") + 1
            if cut:
                self.before_write()
                sink.write(buf[:cut])
                sink.flush()
            self.partial[fd] = buf[cut:]

    def _close(self, fd: int, sink) -> None:
        rest = self.partial.pop(fd, b"")
        if rest:
            self.before_write()
            sink.write(rest + b"\n")
            sink.flush()
        self.sel.unregister(fd)
        os.close(fd)

    def drain(self, timeout: float) -> None:
        """After the ranks exited: forward what is left (a grandchild may hold a pipe open: stop anyway)."""
        deadline = time.monotonic() + timeout
        while any(not callable(k.data) for k in self.sel.get_map().values()) and time.monotonic() < deadline:
            self.pump(0.05)
        for key in list(self.sel.get_map().values()):
            if callable(key.data):
                self.sel.unregister(key.fd)
            else:
                self._close(key.fd, key.data)
