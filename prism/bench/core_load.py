"""A load like a truth rank's on cores a slice run leaves to its replay server (issue 24, an experiment).

    python -m prism.bench.core_load --core C [--idle] [--ready FILE]

Runs the fidelity bench's workload (`prism.workloads.moe_gpt` with the bench's MODEL, one process, no
torch.distributed, one torch thread) step after step, pinned to core C, until it is killed; with `--idle` at
the kernel's SCHED_IDLE policy, so that any other thread on C (the replay server's) takes the core the moment it
wakes and the load only fills the core's idle time. `--ready FILE`: written after the first step.

`CoreLoad(cores, idle=True)` starts one per core and stops them all (`stop`, or leaving a `with`): the bench's
`--slice-load model` runs the slice runs under it, so that a slice's 4 ranks compute while the stream's other
4 cores are busy as the real job's other 4 ranks keep them (a slice otherwise keeps 4 of 8 cores busy, and a
core computes at a speed that depends on how many of the host's cores are busy: `scripts/host_core_load.py`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_TIMEOUT_S = 60.0


def run(core: int, idle: bool, ready: Path | None) -> None:
    os.sched_setaffinity(0, {core})
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from prism.bench.fidelity import MODEL
    from prism.workloads import moe_gpt

    def between(k: int) -> None:
        if k == 2 and ready is not None:
            ready.write_text(str(os.getpid()))

    with open(os.devnull, "w") as null:
        sys.stdout = null
        moe_gpt.main(MODEL + ["--steps", str(10**9)], between_steps=between)


class CoreLoad:
    """One `core_load` process per core of `cores`, running until `stop` (all started before the first step
    is waited for: their import and first step are not in what they load)."""

    def __init__(self, cores: list[int], idle: bool = True) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="prism-core-load-")
        ready = [Path(self.tmp.name) / f"core={c}" for c in cores]
        try:
            for core, path in zip(cores, ready):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "prism.bench.core_load", "--core", str(core), "--ready", str(path),
                     *(["--idle"] if idle else [])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True))
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not all(p.exists() for p in ready):
                dead = [p for p in self.procs if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"a core-load process exited ({dead[0].returncode}): "
                                       f"{dead[0].stderr.read().decode(errors='replace')[-400:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"core-load processes not ready after {READY_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()
            if p.stderr:
                p.stderr.close()
        self.procs = []
        self.tmp.cleanup()

    def __enter__(self) -> "CoreLoad":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", type=int, required=True)
    ap.add_argument("--idle", action="store_true")
    ap.add_argument("--ready", type=Path)
    a = ap.parse_args(argv)
    run(a.core, a.idle, a.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
