"""A load like a truth rank's on cores a slice run leaves to its replay server (issue 24, an experiment).

    python -m prism.bench.core_load --core C [--idle] [--ready FILE] [--mirror CORE]

Full (no `--mirror`): runs the fidelity bench's workload (`prism.workloads.moe_gpt` with the bench's MODEL, one
process, no torch.distributed, one torch thread) step after step, pinned to core C, until it is killed.
Mirror (`--mirror CORE`): computes only while a thread pinned to CORE (a slice rank's: its main thread, its gloo
and autograd threads) is running, and sleeps while none is: CORE's duty cycle and phases copied onto C, in
chunks of the workload's own shapes (an MLP of the model's hidden and ffn sizes on a micro-batch's tokens,
~tens of us; the threads' states are read from /proc between chunks, the threads found again every 0.5 s).
With `--idle` either runs at the kernel's SCHED_IDLE policy, so that any other thread on C (the replay server's)
takes the core the moment it wakes and the load only fills the core's idle time. `--ready FILE`: written once
the load runs.

`CoreLoad(cores, idle=True, mirror=None)` starts one per core and stops them all (`stop`, or leaving a `with`):
the bench's `--slice-load full|mirror` runs the slice runs under it, so that a slice's 4 ranks compute while the
stream's other 4 cores are busy as the real job's other 4 ranks keep them (a slice otherwise keeps 4 of 8 cores
busy, and a core computes at a speed that depends on how many of the host's cores are busy:
`scripts/host_core_load.py`); with `mirror`, core `cores[i]` copies core `mirror[i]`.
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


REFIND_S = 0.5
IDLE_POLL_S = 0.0005  # while the mirrored core idles (the reads cost ~5-20 us: ~5 % of the core)


def threads_on(core: int, skip: int) -> list[str]:
    """/proc stat paths of the threads (of other processes than `skip`) whose affinity is exactly `core`."""
    want = str(core)
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == skip:
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("Cpus_allowed_list:"):
                            if line.split(":", 1)[1].strip() == want:
                                found.append(f"/proc/{pid}/task/{tid}/stat")
                            break
        except OSError:
            continue
    return found


def running(paths: list[str]) -> bool:
    """Whether any of the threads is running (state R) now."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] == b"R":
            return True
    return False


def mirror(core: int, ready: Path | None) -> None:
    import torch

    from prism.bench.fidelity_table import MODEL

    arg = dict(zip(MODEL[::2], MODEL[1::2]))
    hidden, ffn = int(arg["--hidden"]), int(arg["--ffn-hidden"])
    tokens = int(arg["--seq-len"]) * int(arg["--micro-batch-size"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g)
    w1, w2 = torch.randn(hidden, ffn, generator=g) / hidden**0.5, torch.randn(ffn, hidden, generator=g) / ffn**0.5
    paths, found_at, ready_written = [], 0.0, False
    while True:
        now = time.monotonic()
        if now - found_at > REFIND_S:
            paths, found_at = threads_on(core, os.getpid()), now
        if not ready_written and ready is not None:
            ready.write_text(str(os.getpid()))
            ready_written = True
        if running(paths):
            for _ in range(2):
                torch.nn.functional.gelu(x @ w1) @ w2
        else:
            time.sleep(IDLE_POLL_S)


def run(core: int, idle: bool, ready: Path | None, mirror_core: int | None = None) -> None:
    os.sched_setaffinity(0, {core})
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    if mirror_core is not None:
        mirror(mirror_core, ready)
        return
    from prism.bench.fidelity_table import MODEL
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

    def __init__(self, cores: list[int], idle: bool = True, mirror: list[int] | None = None) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="prism-core-load-")
        ready = [Path(self.tmp.name) / f"core={c}" for c in cores]
        try:
            for i, (core, path) in enumerate(zip(cores, ready)):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "prism.bench.core_load", "--core", str(core), "--ready", str(path),
                     *(["--idle"] if idle else []), *(["--mirror", str(mirror[i])] if mirror else [])],
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
    ap.add_argument("--mirror", type=int, metavar="CORE", help="compute only while a thread pinned to CORE runs")
    a = ap.parse_args(argv)
    run(a.core, a.idle, a.ready, a.mirror)
    return 0


if __name__ == "__main__":
    sys.exit(main())
