"""A one-line progress report of a capture on stderr: ranks done, communications completed, logical time.

On a terminal the line is rewritten in place once a second (and wiped before any rank's output is
forwarded, so it never mixes with it); into a log (`prism launch --progress` with stderr redirected) a line
is written every LOG_PERIOD_S, so a long capture shows it is alive without flooding the log.
"""

from __future__ import annotations

import time
from typing import TextIO

TTY_PERIOD_S = 1.0
LOG_PERIOD_S = 30.0


class CaptureProgress:
    def __init__(self, stream: TextIO, tty: bool) -> None:
        self.stream = stream
        self.tty = tty
        self.period = TTY_PERIOD_S if tty else LOG_PERIOD_S
        self.started = time.monotonic()
        self.next_at = self.started + self.period
        self.visible = False  # a terminal line is shown and must be wiped before other output

    def maybe_show(self, coord) -> None:
        """Show the coordinator's state if a period passed (called from the supervisor's loop)."""
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.period
        text = self.describe(coord, now - self.started)
        if self.tty:
            self.stream.write(f"\r\x1b[K{text}")
            self.visible = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    @staticmethod
    def describe(coord, elapsed_s: float) -> str:
        counts = coord.counts
        live = [rs.logical_ns for rs in coord.ranks if rs.state != "exited"]
        slowest = f", slowest rank at {min(live) / 1e9:.1f} s of compute" if live else ""
        return (f"[prism] capture {elapsed_s:.0f} s: {counts['exited']}/{coord.world} ranks done, "
                f"{counts['running']} running, {counts['blocked']} waiting; "
                f"{coord.completed_keys} communications completed{slowest}")

    def clear(self) -> None:
        """Wipe the terminal line (before a rank's output, and at the end)."""
        if self.visible:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.visible = False
