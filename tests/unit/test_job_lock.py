"""One lock and one sweep of dead temporaries for every command that writes into a job folder (issue 23: two
`prism emulate` at once kept one emulation/; a killed stage's `*.tmp-*` stayed for ever).

Another command holds the job (a subprocess, as a second `prism` run would): each stage is refused at once with
PRISM_LOCK_WAIT=0, naming the holder; by default the second waits for the first and then runs. A stage that
takes the lock removes the temporaries of a command killed outright, never those of a live one."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from prism import folder_lock

# command, its module, the rest of its arguments after --job JOB
STAGES = [
    ("prism graph", "prism.graph", []),
    ("prism slices plan", "prism.slices.plan", ["--devices", "1"]),
    ("prism slices run", "prism.slices.run", ["--slice", "0"]),
    ("prism slices durations", "prism.calibrate.from_slices", []),
    ("prism calibrate", "prism.calibrate.stage", []),
    ("prism emulate", "prism.emulate.stage", []),
    ("prism summary", "prism.summary", []),
    ("prism report", "prism.report.stage", []),
    ("prism export", "prism.report.export", ["--timeline", "calibrated", "--format", "perfetto"]),
    ("prism sql", "prism.sql", ["--write-catalog"]),
]

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from prism import folder_lock
    job = Path(sys.argv[1])
    fd = folder_lock.lock_folder(job, str, "prism graph")
    (job / "graph").mkdir(exist_ok=True)
    (job / "graph" / f".events.parquet.tmp-{__import__('os').getpid()}").write_text("half")
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    folder_lock.unlock_folder(job, fd)
""")


def hold(job, seconds: float) -> subprocess.Popen:
    """Another prism command holding `job` (it also leaves a temporary, as a stage writing would)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(job), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("command,module,rest", STAGES, ids=[s[0] for s in STAGES])
def test_a_second_command_on_a_held_job_is_refused_with_the_holder_named(tmp_path, monkeypatch, capsys, command,
                                                                          module, rest):
    monkeypatch.setenv("PRISM_LOCK_WAIT", "0")
    job = tmp_path / "job"
    job.mkdir()
    holder = hold(job, 60)
    try:
        code = importlib.import_module(module).main(["--job", str(job), *rest])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"{job} is in use by another prism run (pid {holder.pid}: prism graph)" in err, err
        assert "PRISM_LOCK_WAIT=S waits longer" in err and err.count("\n") == 1, err
    finally:
        holder.kill()
        holder.wait()


def test_by_default_the_second_waits_for_the_first_then_runs(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    holder = hold(job, 1.5)
    began = time.monotonic()
    from prism import graph
    code = graph.main(["--job", str(job)])
    err = capsys.readouterr().err
    assert time.monotonic() - began >= 1.0
    assert f"prism graph: {job} is in use by another prism run (pid {holder.pid}: prism graph); waiting for it" in err
    assert code == 2 and "in use" not in err.splitlines()[-1], err  # then it ran: there is no capture here
    holder.wait()
    assert not (job / folder_lock.LOCK_NAME).exists()


def test_a_killed_commands_temporaries_are_swept_by_the_next_one_and_a_live_ones_kept(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    killed = hold(job, 60)
    killed.send_signal(signal.SIGKILL)  # killed outright while writing: its temporary stays
    killed.wait()
    dead = job / "graph" / f".events.parquet.tmp-{killed.pid}"
    assert dead.exists()
    (job / "slices" / "slice=0").mkdir(parents=True)
    deep = job / "slices" / "slice=0" / f".events.parquet.tmp-{killed.pid}"
    deep.write_text("half")
    staging = job / f".emulation.tmp-{killed.pid}"
    (staging / "run").mkdir(parents=True)
    live = job / f".prism.duckdb.tmp-{os.getppid()}"  # a live process's (never touched)
    live.write_text("live")
    payloads = job / "payloads" / f".x.tmp-{killed.pid}"  # a run folder's own: its launch sweeps them
    payloads.parent.mkdir()
    payloads.write_text("p")
    from prism import summary
    assert summary.main(["--job", str(job)]) == 2  # nothing to summarise; but it held the job and swept it
    assert not dead.exists() and not deep.exists() and not staging.exists()
    assert live.exists() and payloads.exists()
    assert not list(job.glob(".prism.lock"))
