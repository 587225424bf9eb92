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


class FileOutput:
    """The ranks' stdout and stderr in files instead of pipes (a capture whose pipes would not fit the open-file
    limit: `limits.rank_output`): a rank writes FOLDER/R.out and R.err; the zygote forwards each rank's two
    files, whole, when it ends (`forward`), and what is left at the end (`forward_rest`). The zygote then holds
    no file descriptor for a rank's output."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def attach(self, rank: int) -> None:
        """In the forked rank: its stdout and stderr become its two files."""
        for fd, stream in ((1, "out"), (2, "err")):
            f = os.open(f"{self.folder}/{rank}.{stream}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            os.dup2(f, fd)
            os.close(f)

    def forward(self, rank: int, before_write, stdout, stderr) -> None:
        for stream, sink in (("out", stdout), ("err", stderr)):
            path = f"{self.folder}/{rank}.{stream}"
            try:
                with open(path, "rb") as f:
                    data = f.read()
                os.unlink(path)
            except FileNotFoundError:
                continue
            if data:
                before_write()
                sink.write(data if data.endswith(b"\n") else data + b"\n")
                sink.flush()

    def forward_rest(self, before_write, stdout, stderr) -> None:
        ranks = sorted({int(name.split(".")[0]) for name in os.listdir(self.folder) if name[0].isdigit()})
        for rank in ranks:
            self.forward(rank, before_write, stdout, stderr)
