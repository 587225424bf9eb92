"""The fidelity bench's pipeline steps as subprocesses: one at a time (`_run`) or several at once (`_run_parallel`),
their output appended to the config's log, a failure raised as `StepError` with the log's tail
(`prism/bench/fidelity.py` runs the configs with them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from prism.bench.fidelity_score import StepError


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    """Run one pipeline step; its output goes to `log`; StepError with the log's tail on failure."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-6:]
        raise StepError(f"{' '.join(cmd[2:5])} ... exited {code}: " + " | ".join(tail))


def _prism(*args: str) -> list[str]:
    return [sys.executable, "-m", "prism.cli", *args]


def _py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


WORKLOAD = ["-m", "prism.workloads.moe_gpt"]


def _run_parallel(cmds: list[list[str]], log: Path, timeout: float, jobs: int) -> None:
    """Run independent steps, at most `jobs` at once; their outputs go to `log` one after the other, in order;
    StepError (the first failed step's) once all have ended."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    outs = [log.with_name(f".{log.name}.{i}") for i in range(len(cmds))]
    running: list[tuple[int, subprocess.Popen]] = []
    codes: dict[int, int | str] = {}
    started = time.monotonic()
    try:
        for i, cmd in enumerate(cmds):
            while len(running) >= max(jobs, 1):
                running = _reap(running, codes, started, timeout)
            with open(outs[i], "wb") as f:
                running.append((i, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)))
        while running:
            running = _reap(running, codes, started, timeout)
    finally:
        for _, proc in running:
            proc.kill()
            proc.wait()
        with open(log, "ab") as f:
            for cmd, out in zip(cmds, outs):
                f.write(("$ " + " ".join(cmd) + "\n").encode())
                if out.is_file():
                    f.write(out.read_bytes())
                    out.unlink()
    failed = [(cmds[i], code) for i, code in sorted(codes.items()) if code != 0]
    if failed:
        raise StepError(f"{' '.join(failed[0][0][2:5])} ... exited {failed[0][1]} (and {len(failed) - 1} more; "
                        f"see {log})")


def _reap(running: list, codes: dict, started: float, timeout: float) -> list:
    """The steps of `running` still running, after a short wait; the ended ones' codes into `codes`."""
    time.sleep(0.02)
    still = []
    for i, proc in running:
        code = proc.poll()
        if code is None and time.monotonic() - started > timeout:
            proc.kill()
            proc.wait()
            code = "timeout"
        if code is None:
            still.append((i, proc))
        else:
            codes[i] = code
    return still
