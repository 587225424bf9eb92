"""One-line progress reports on stderr: a capture's (ranks done, communications completed, logical time) and a
real, slice or emulation run's (iterations its real ranks finished, as a bar drawn by tqdm's `format_meter`).

A rank notes each iteration it ends (`note_iteration`, called by the optimizer-step hook of `markers`) in a
one-number file of the launch's status folder (`PRISM_PROGRESS_DIR`), rewritten in place: one `pwrite` per
iteration, nothing on the hot path of a microbatch. The supervisor reads those files once a period.

On a terminal the line is rewritten in place once a second (and wiped before any rank's output is
forwarded, so it never mixes with it); into a log (`prism launch --progress` with stderr redirected) a line
is written every LOG_PERIOD_S, so a long capture shows it is alive without flooding the log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

from prism import settings


TTY_PERIOD_S = 1.0
LOG_PERIOD_S = 30.0


ENV = settings.PROGRESS_DIR.name
_fd: int | None = None


def note_iteration(done: int) -> None:
    """Rank side: `done` iterations ended (a no-op unless the launch asked for progress)."""
    global _fd
    folder = settings.PROGRESS_DIR.get()
    if not folder:
        return
    if _fd is None:
        _fd = os.open(Path(folder) / f"iterations-rank{os.environ.get('RANK', '0')}",
                      os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(_fd, f"{done:>12d}".encode(), 0)


def iterations_done(folder: Path, ranks: list[int]) -> int:
    """The fewest iterations any of `ranks` has ended (0 for a rank that has not noted one yet)."""
    fewest = None
    for r in ranks:
        try:
            text = (folder / f"iterations-rank{r}").read_bytes().strip()
        except OSError:
            text = b""
        n = int(text) if text.isdigit() else 0
        fewest = n if fewest is None else min(fewest, n)
    return fewest or 0


class _Line:
    """A status line: rewritten in place on a terminal every TTY_PERIOD_S, a line every LOG_PERIOD_S in a log."""

    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self.period = TTY_PERIOD_S if tty else LOG_PERIOD_S
        self.started = time.monotonic()
        self.next_at = self.started + self.period
        self.visible = False  # a terminal line is shown and must be wiped before other output

    def maybe_show(self, state) -> None:
        """Show `state` if a period passed (called from the supervisor's loop)."""
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.period
        self._write(self.describe(state, now - self.started))

    def describe(self, state, elapsed_s: float) -> str:
        raise NotImplementedError

    def _write(self, text: str) -> None:
        if self.tty:
            self.stream.write(f"\r\x1b[K{text}")
            self.visible = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Wipe the terminal line (before a rank's output, and at the end)."""
        if self.visible:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.visible = False


class CaptureProgress(_Line):
    @staticmethod
    def describe(coord, elapsed_s: float) -> str:
        counts = coord.counts
        live = [rs.logical_ns for rs in coord.ranks if rs.state != "exited"]
        slowest = f", slowest rank at {min(live) / 1e9:.1f} s of compute" if live else ""
        return (f"[prism] capture {elapsed_s:.0f} s: {counts['exited']}/{coord.world} ranks done, "
                f"{counts['running']} running, {counts['blocked']} waiting; "
                f"{coord.completed_keys} communications completed{slowest}")


class IterationProgress(_Line):
    """Iterations ended by the slowest of a run's real ranks, against the capture's count when known."""

    def __init__(self, stream: TextIO, tty: bool, mode: str, ranks: list[int], total: int | None) -> None:
        super().__init__(stream, tty)
        self.mode, self.ranks, self.total = mode, ranks, total

    def describe(self, folder: Path, elapsed_s: float) -> str:
        shown = ",".join(map(str, self.ranks[:8])) + (",..." if len(self.ranks) > 8 else "")
        from tqdm import tqdm  # the supervisor's only: ranks never import it

        meter = tqdm.format_meter(iterations_done(folder, self.ranks), self.total, elapsed_s, ncols=100,
                                  unit="it", ascii=not self.tty)
        return f"[prism] {self.mode} ranks {shown}: {meter}"
