"""The capture's progress line: what it says about the coordinator, and how often it is written."""

from __future__ import annotations

import io

from prism.runtime.launch import progress
from prism.runtime.capture.coordinator import Coordinator


def coordinator_midway() -> Coordinator:
    """W=3 on 1 slot: rank 0 ran 2 s of compute and exited, rank 1 ran 0.5 s and waits on an all_reduce
    with rank 2, which holds the slot (1.2 s so far)."""
    c = Coordinator(3, 1)
    for r in range(3):
        c.handle(r, ("hello",))                      # rank 0 gets the slot
    c.handle(0, ("exit", 0))                         # rank 1 gets it
    key = ("c", "g", 0)
    c.handle(1, ("arrive", key, (1, 2), ("all_reduce", "float32", "4", 16)))
    c.handle(1, ("wait", [key], 500_000_000))        # rank 1 blocks, rank 2 runs
    c.ranks[0].logical_ns = 2_000_000_000           # done: not the slowest any more
    c.ranks[2].logical_ns = 1_200_000_000
    return c


def test_describe_counts_ranks_and_the_slowest_live_rank():
    text = progress.CaptureProgress.describe(coordinator_midway(), 12.4)
    assert text == ("[prism] capture 12 s: 1/3 ranks done, 1 running, 1 waiting; 0 communications completed, "
                    "slowest rank at 0.5 s of compute")


def test_log_mode_writes_a_line_per_period(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    p = progress.CaptureProgress(stream, tty=False)
    c = coordinator_midway()
    p.maybe_show(c)
    assert stream.getvalue() == ""                   # nothing before the first period
    clock[0] += progress.LOG_PERIOD_S
    p.maybe_show(c)
    p.maybe_show(c)                                  # same instant: not again
    clock[0] += progress.LOG_PERIOD_S - 1
    p.maybe_show(c)
    lines = stream.getvalue().splitlines()
    assert lines == ["[prism] capture 30 s: 1/3 ranks done, 1 running, 1 waiting; 0 communications completed, "
                     "slowest rank at 0.5 s of compute"]
    p.clear()                                        # nothing to wipe in a log
    assert stream.getvalue().count("\r") == 0


def test_tty_mode_rewrites_one_line_and_wipes_it(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    p = progress.CaptureProgress(stream, tty=True)
    c = coordinator_midway()
    for _ in range(2):
        clock[0] += progress.TTY_PERIOD_S
        p.maybe_show(c)
    p.clear()
    p.clear()
    out = stream.getvalue()
    assert "\n" not in out
    assert out.count("\r\x1b[K[prism] capture") == 2 and out.endswith("of compute\r\x1b[K")


def test_ranks_note_iterations_and_the_line_shows_the_slowest(tmp_path, monkeypatch):
    """Each rank rewrites its count in place; the line shows the fewest iterations of the run's real ranks
    against the capture's total, as tqdm's meter (n/total and a bar)."""
    monkeypatch.setenv(progress.ENV, str(tmp_path))
    for rank, done in ((3, 7), (5, 12)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setattr(progress, "_fd", None)
        for k in range(1, done + 1):
            progress.note_iteration(k)
    assert (tmp_path / "iterations-rank5").read_bytes().strip() == b"12"
    assert progress.iterations_done(tmp_path, [3, 5]) == 7
    assert progress.iterations_done(tmp_path, [3, 5, 9]) == 0            # rank 9 has ended none yet
    p = progress.IterationProgress(io.StringIO(), False, "slice", [3, 5], 16)
    text = p.describe(tmp_path, 10.0)
    assert text.startswith("[prism] slice ranks 3,5: ") and " 7/16 " in text and "|" in text, text


def test_note_iteration_without_a_progress_folder_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    progress.note_iteration(1)
    assert list(tmp_path.iterdir()) == []
