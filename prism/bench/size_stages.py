"""The stages of one bench size, measured one by one (`prism bench capture`, `prism.bench.scale_slices`).

`_stage` runs one stage's command to its end (wall, max RSS; stopped past the time left); `Stages` keeps each
stage's numbers in the size's row as it ends, and when one fails records which and why (one line) and runs
no later one, so a size whose report fails still has its capture, graph, plan, slices and calibration
(issue 25's host call lost whole rows to a missing plotly). `extrapolated_s` guesses a size's time from the
sizes before it (the bench skips a size that would not fit its budget); `write_json` replaces the rows file
whole after every stage (a run killed at any moment leaves what it measured).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path



def folder_bytes(path: Path) -> int:
    """The bytes of the files under `path` (0 when it does not exist): an artifact's size in a bench row."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0

def _stage(cmd: list[str], what: str, timeout: float | None = None) -> tuple[float, int]:
    """Run one stage to its end: (wall seconds, the stage process's own max RSS in bytes, from wait4). A stage
    still running after `timeout` seconds is stopped (SIGTERM, then SIGKILL) and reported as such."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        timer = None
        if timeout is not None:
            timer = threading.Timer(max(1.0, timeout), _stop_process, args=(proc,))
            timer.daemon = True
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        if timer is not None:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            err.seek(0)
            late = f" after {wall:.0f} s (stopped: over the {timeout:.0f} s left of the budget)" \
                if timeout is not None and wall >= timeout else ""
            raise RuntimeError(f"{what} failed ({proc.returncode}){late}:\n{err.read()[-2000:]}")
    return wall, usage.ru_maxrss * 1024


def _stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    kill = threading.Timer(10.0, lambda: proc.poll() is None and proc.kill())
    kill.daemon = True
    kill.start()


def one_line(exc: BaseException) -> str:
    """A stage's error as one line: its first line and its last (where the cause usually is)."""
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()] or [type(exc).__name__]
    return " ".join(dict.fromkeys([lines[0], lines[-1]]))[:400]


class Stages:
    """The stages of one size, each measured into `row` as it ends: a stage that fails records its name and
    its one-line error (`failed_stage`, `error`) and the later stages do not run, while the numbers of the
    stages before it stay in the row. `save(row)` is called after every stage (the bench's --json)."""

    def __init__(self, row: dict, left, save=None) -> None:
        self.row, self.left, self.save = row, left, save or (lambda row: None)

    @property
    def failed(self) -> bool:
        return "failed_stage" in self.row

    def fail(self, what: str, exc: BaseException) -> None:
        self.row["failed_stage"], self.row["error"] = what, one_line(exc)
        print(f"  W={self.row['W']}: {exc}", file=sys.stderr, flush=True)
        self.save(self.row)

    def run(self, key: str, cmd: list[str], what: str) -> bool:
        """Run one stage (`_stage`) into row[key_s], row[key_rss]; False (and nothing run) once one failed."""
        if self.failed:
            return False
        try:
            self.row[key + "_s"], self.row[key + "_rss"] = _stage(cmd, what, self.left())
        except RuntimeError as exc:
            self.fail(what, exc)
            return False
        self.save(self.row)
        return True


SIZE_STAGES = ("graph", "plan", "bare_calibrate", "slices_run", "from_slices", "calibrate", "emulate", "summary",
               "report")


def size_seconds(row: dict) -> float:
    """A size's wall seconds: its capture and every stage after it that ran."""
    return row["wall_s"] + sum(row.get(k + "_s", 0) for k in SIZE_STAGES)


def extrapolated_s(w: int, done: list[dict]) -> tuple[float, str] | None:
    """What W ranks will take, from the sizes that ran every stage: through the last two, a fixed part and one
    per rank (a small size is mostly fixed costs: scaling it by W alone would skip sizes that fit); from one,
    in proportion to W when it is >= 512 ranks; else None (nothing to go by: the stages' own timeouts stop
    what would not end in the budget)."""
    pts = sorted({r["W"]: size_seconds(r) for r in done if not r.get("skipped") and not r.get("failed_stage")
                  and "wall_s" in r}.items())
    if len(pts) >= 2:
        (w1, t1), (w2, t2) = pts[-2:]
        per = max(0.0, (t2 - t1) / (w2 - w1))
        return max(0.0, t2 - per * w2) + per * w, f"from W={w1} and W={w2}"
    if pts and pts[-1][0] >= 512:
        return pts[-1][1] * w / pts[-1][0], f"from W={pts[-1][0]}"
    return None


def write_json(path: Path, rows: list[dict]) -> None:
    """The rows, replaced whole (a temporary file renamed): a run killed at any moment leaves the last rows."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)
