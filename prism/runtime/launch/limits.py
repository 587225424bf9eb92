"""The machine's limits that a job of W ranks on one host can hit, checked before anything starts and
watched while it runs: each message names the limit, what the job needs, and the fix.

- open files (`ulimit -n`): prism's supervisor holds, per rank, two output pipes, and in capture the
  rank's control socket and its connection to the rendezvous store (FDS_PER_RANK_COORDINATED). A capture whose pipes
  would not fit the hard limit (W=8192 with 4 a rank needs 32,832; a host may allow 20,000) writes each
  rank's output to two files instead, forwarded when the rank ends (`rank_output`): 2 a rank.
- processes (`ulimit -u`, kernel.pid_max, kernel.threads-max): one process per rank, a few threads each.
- memory: capture forks W ranks of `rank_mib_estimate()` private MiB each (measured: `prism bench capture`,
  ~10.5 MiB with the zygote's objects immortal on CPython 3.12+, ~14 without) plus the zygote; while the capture runs, `MemoryWatch` stops it
  with a clear message before the machine runs out (the alternative is the kernel's reclaim crawl, then
  the OOM killer, i.e. a hang then a half-dead job).
- /dev/shm: the contributions in flight live there; a full /dev/shm fails the writing rank with
  `ShmFull` (the job stops, nothing is published), and less than SHM_MIN_BYTES free refuses the start.

Every reading goes through a function of this module, so tests simulate a small machine by replacing one.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from prism import settings
from prism.runtime import modes

FDS_PER_RANK = 2  # the output pipes
FDS_PER_RANK_COORDINATED = 4  # capture: also the control socket and the store's connection
FDS_PER_RANK_FILE_OUTPUT = 2  # capture, the ranks' output in files: the control socket, the store's connection
OUTPUT_ENV = settings.RANK_OUTPUT.name  # "files" or "pipes": force how a capture's ranks' output reaches the launcher
FDS_SPARE = 64
FORK_BATCH = 64  # ranks a fork helper forks (`rank_fork`): the zygote holds one batch's child ends at a time
FORK_BATCH_ENV = settings.FORK_BATCH.name  # N: the ranks a helper forks; 0: the zygote forks every rank itself
THREADS_PER_RANK = 4  # the main thread plus the few that torch and the store client start
# A capture rank's private MiB (its end-of-rank smaps_rollup, `prism bench capture`), by interpreter: with the
# zygote's objects immortal (CPython 3.12+, `immortal`) 10.4 / 10.6 MiB median / max at W=256 and 10.8 / 11.7
# at W=1024 on the accelerator host (Python 3.12.3; docs/results/scale/s7/probe, docs/benchmarks.md "Session 7");
# without (3.11, or PRISM_IMMORTAL=0) 15.4 / 15.7 at W=256 there and 15.6 / 16.1 at W=1024 (docs/results/scale/s5),
# 16.0 / 16.3 at W=16 on the 2-core VM (3.11); since the zygote takes its C heap's free chunks
# (`memory.fill_heap_holes`) 14.3 / 14.5 at W=16 and 14.3 / 18.0 at W=256 there (3.11, weak layouts; 16.5 / 16.7
# and 16.5 / 18.6 with PRISM_HEAP_HOLES=0; docs/results/scale/s11-memory), not yet measured on 3.12. The
# estimate is the median rounded down: the check refuses only what surely cannot fit.
RANK_MIB_IMMORTAL = 10
RANK_MIB_MORTAL = 14
ZYGOTE_MIB_ESTIMATE = 600
SHM_MIN_BYTES = 64 << 20
MEMORY_FLOOR_FRACTION = 0.03  # MemoryWatch stops the job when less than this much of memory is left
MEMORY_FLOOR_MAX = 1 << 30


def rank_mib_estimate() -> int:
    """Private MiB a capture rank costs with this interpreter (the zygote makes its objects immortal or not)."""
    from prism.runtime.launch import immortal

    mortal = immortal.unavailable() is not None or os.environ.get(immortal.ENV, "1") == "0"
    return RANK_MIB_MORTAL if mortal else RANK_MIB_IMMORTAL


class LimitError(Exception):
    """A job that cannot run on this machine as configured: the message names the limit and the fix."""


def nofile_limits() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def nproc_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    return soft


def kernel_limit(name: str) -> int | None:
    try:
        return int(Path("/proc/sys/kernel", name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...)."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    except OSError:
        pass
    return out


def cgroup_room() -> int | None:
    """Bytes this process's memory cgroup still allows (v2 memory.max or v1 limit), None if unlimited."""
    try:
        line = next(l for l in open("/proc/self/cgroup") if l.startswith("0::"))
        base = Path("/sys/fs/cgroup") / line.split("::", 1)[1].strip().lstrip("/")
        limit, usage = (base / "memory.max").read_text().strip(), (base / "memory.current").read_text()
        return None if limit == "max" else max(0, int(limit) - int(usage))
    except (OSError, StopIteration, ValueError):
        pass
    try:
        mine = next(l.split(":", 2)[2].strip() for l in open("/proc/self/cgroup") if ":memory:" in l)
        base = Path("/sys/fs/cgroup/memory") / mine.lstrip("/")
        limit = int((base / "memory.limit_in_bytes").read_text())
        usage = int((base / "memory.usage_in_bytes").read_text())
        return None if limit >= 1 << 60 else max(0, limit - usage)
    except (OSError, StopIteration, ValueError):
        return None


def available_memory() -> tuple[int, int]:
    """(bytes available to this job now, total bytes of the machine or its cgroup)."""
    info = meminfo()
    total = info.get("MemTotal", 0)
    avail = info.get("MemAvailable", total)
    room = cgroup_room()
    if room is not None and room < avail:
        return room, room + (total - avail if total > avail else 0)
    return avail, total


def shm_free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def fork_batch(world: int) -> int:
    """Ranks a fork helper forks (`rank_fork`; 0: the zygote forks every rank itself): FORK_BATCH or
    PRISM_FORK_BATCH, when there are at least two batches."""
    text = (settings.FORK_BATCH.raw() or "").strip()
    batch = int(text) if text.isdigit() else FORK_BATCH
    return batch if 0 < batch and world >= 2 * batch else 0


def _per_rank(mode: str) -> int:
    return FDS_PER_RANK_COORDINATED if modes.get(mode).coordinator else FDS_PER_RANK


def fds_needed(world: int, mode: str, output: str = "pipes") -> int:
    per = FDS_PER_RANK_FILE_OUTPUT if output == "files" else _per_rank(mode)
    # while a batch is forked by a helper, the zygote also holds its ranks' child ends (2 output pipes unless
    # files, 1 control socket in capture) and the helpers' pid pipe (2)
    child_ends = (0 if output == "files" else 2) + modes.get(mode).coordinator
    batch = fork_batch(world)
    return per * world + FDS_SPARE + (child_ends * batch + 2 if batch else 0)


def rank_output(world: int, mode: str, hard: int | None = None) -> str:
    """How the ranks' stdout and stderr reach the launcher: "pipes" (forwarded as they write) or, in capture
    when a pipe pair a rank would not fit the hard open-file limit, "files" (each rank's, forwarded when it
    ends). PRISM_RANK_OUTPUT=files|pipes chooses (files: capture only)."""
    forced = settings.RANK_OUTPUT.get()
    if not modes.get(mode).coordinator:
        return "pipes"
    if forced in ("files", "pipes"):
        return forced
    if hard is None:
        hard = nofile_limits()[1]
    if hard == resource.RLIM_INFINITY or hard >= fds_needed(world, mode):
        return "pipes"
    return "files"


def check_start(world: int, mode: str, shm_root: str | None) -> None:
    """Before any rank starts: raise LimitError if this machine cannot hold `world` ranks in `mode`."""
    soft, hard = nofile_limits()
    output = rank_output(world, mode, hard)
    need = fds_needed(world, mode, output)
    if hard != resource.RLIM_INFINITY and hard < need:
        per = FDS_PER_RANK_FILE_OUTPUT if output == "files" else _per_rank(mode)
        raise LimitError(
            f"{world} ranks need about {need} open files in prism's supervisor ({per} a "
            f"rank), but this shell allows at most {hard} (`ulimit -Hn`): raise the limit (`ulimit -n {need}`; "
            "the hard limit as root or in /etc/security/limits.conf) or launch fewer ranks")
    procs = nproc_limit()
    if procs != resource.RLIM_INFINITY and procs < world + 16:
        raise LimitError(f"{world} ranks are {world} processes, but this user may run at most {procs} "
                         f"(`ulimit -u`): raise it (`ulimit -u {world + 64}`) or launch fewer ranks")
    for name, per in (("pid_max", 1), ("threads-max", THREADS_PER_RANK)):
        value = kernel_limit(name)
        if value is not None and value < world * per + 256:
            raise LimitError(f"{world} ranks need about {world * per} process ids, but kernel.{name} is {value}: "
                             f"raise it (`sysctl -w kernel.{name}={world * per * 2}`) or launch fewer ranks")
    if not modes.get(mode).coordinator:  # only capture holds all W ranks on this machine
        return
    avail, total = available_memory()
    per_rank = rank_mib_estimate()
    need_mem = (world * per_rank + ZYGOTE_MIB_ESTIMATE) << 20
    if total and avail < need_mem:
        raise LimitError(
            f"capture of {world} ranks needs at least {need_mem / 2**30:.1f} GiB ({per_rank} MiB a rank "
            f"plus the zygote), but only {avail / 2**30:.1f} GiB of {total / 2**30:.1f} GiB is available: "
            "free memory, use a machine with more, or capture fewer ranks")
    if shm_root is not None:
        free = shm_free_bytes(shm_root)
        if free < SHM_MIN_BYTES:
            raise LimitError(
                f"{shm_root} has {free / 2**20:.0f} MiB free; capture moves every collective's data through it and "
                f"needs at least {SHM_MIN_BYTES >> 20} MiB: free it (stale files?) or enlarge it "
                f"(`mount -o remount,size=4G {shm_root}`, or docker's --shm-size)")


class MemoryWatch:
    """Polled by the supervisor: a message once the memory left drops below the floor (else None)."""

    def __init__(self, world: int, period_s: float = 1.0, reader=available_memory) -> None:
        self.world, self.period, self.reader = world, period_s, reader
        self.next_at = 0.0
        self.low = None

    def floor(self, total: int) -> int:
        return int(min(MEMORY_FLOOR_MAX, total * MEMORY_FLOOR_FRACTION))

    def check(self, now: float) -> str | None:
        if now < self.next_at:
            return None
        self.next_at = now + self.period
        avail, total = self.reader()
        if not total or avail >= self.floor(total):
            return None
        return (f"memory nearly exhausted: {avail / 2**20:.0f} MiB left of {total / 2**30:.1f} GiB with "
                f"{self.world} ranks (about {rank_mib_estimate()}-20 MiB each); stopped before the machine runs out. "
                "Free memory, use a machine with more, or capture fewer ranks")
