"""The cores a timed run pins its ranks to, held for the run so that no other prism run pins to them.

A run whose timings are measured on cores (`--pin` in real, slice and emulate; capture's device slots) claims
the cores it pins to before it starts: an `flock` per core on `SHM_ROOT/prism-cores-UID/core=N.lock` (the file
holds the holder's pid and what it runs). It takes the first free cores of its affinity (or exactly the cores the
run names, `LaunchSpec.pin_cores`: a benchmark that pins every run to the same ones); when fewer are free
than it needs, it waits for them (saying once which runs hold them), `PRISM_LOCK_WAIT` seconds at most (0:
refused at once), and is then refused with one message naming the holders and the fix. The kernel drops a
claim when its launcher dies, however it dies. The ranks are pinned to the claimed cores (`ZygoteSpec.cores`);
the replay process of slice and emulate keeps to the cores no rank of this run is pinned to.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from pathlib import Path

from prism import folder_lock, settings
from prism.runtime import modes

POLL_S = 0.2


class CoresBusy(Exception):
    """Too few cores are free of other prism runs: the message names the holders and the fix."""


def lock_dir() -> Path:
    from prism.runtime.launch.run_files import SHM_ROOT

    return Path(SHM_ROOT) / f"prism-cores-{os.getuid()}"


def needed(mode_name: str, nproc: int, pin: bool, devices: int | None, ranks: list[int]) -> int:
    """How many cores the run pins its ranks to (0: it pins none, nothing to claim)."""
    mode = modes.get(mode_name)
    cores = len(os.sched_getaffinity(0))
    if mode.coordinator:  # capture: one core a device slot
        return min(devices or cores, cores)
    if not pin:
        return 0
    if mode.sandbox:
        return min(devices or len(ranks), cores)
    return min(len(ranks) if ranks else nproc, cores)


class CoreClaim:
    """The cores this run holds (`cores`, in pinning order) until `release`. `order`: the cores to take, in
    pinning order (none other: a busy one is waited for, then refused); default the affinity's, lowest first."""

    def __init__(self, count: int, what: str, order: list[int] | None = None) -> None:
        self.fds: list[int] = []
        self.cores: list[int] = []
        if count <= 0:
            return
        allowed = sorted(os.sched_getaffinity(0))
        if order:
            outside = [c for c in order if c not in allowed]
            if outside or len(set(order)) < count:
                raise CoresBusy(f"this run pins its ranks to {count} core(s) of {list(order)}, but "
                                + (f"core(s) {outside} are not in this process's affinity {allowed}"
                                   if outside else f"that names only {len(set(order))} distinct core(s)")
                                + ": name cores of the affinity, as many as the ranks pinned")
        self.order = list(dict.fromkeys(order)) if order else allowed
        folder = lock_dir()
        folder.mkdir(mode=0o700, exist_ok=True)
        wait = folder_lock.wait_s()
        deadline = time.monotonic() + wait
        told = False
        while True:
            holders = self._try(folder, count, what)
            if holders is None:
                return
            if time.monotonic() >= deadline:
                raise CoresBusy(f"this run pins its ranks to {count} core(s), but only "
                                f"{len(os.sched_getaffinity(0)) - len(holders)} of this machine's are free: "
                                f"{_held(holders)}; wait for them to finish (waited {wait:g} s: "
                                f"{settings.LOCK_WAIT.name}=S waits longer), or pin fewer ranks (--devices)")
            if not told:
                print(f"[prism] waiting for {count} free core(s): {_held(holders)} (up to {wait:g} s, "
                      f"{settings.LOCK_WAIT.name})", file=sys.stderr, flush=True)
                told = True
            time.sleep(POLL_S)

    def _try(self, folder: Path, count: int, what: str) -> dict[int, str] | None:
        """Take `count` free cores (None), or take none and return the busy ones' holders."""
        holders: dict[int, str] = {}
        for core in self.order:
            if len(self.cores) == count:
                break
            fd = os.open(folder / f"core={core}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                holders[core] = os.read(fd, 256).decode(errors="replace").strip().replace("\n", ": ") or "unknown"
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n{what}\n".encode())
            self.fds.append(fd)
            self.cores.append(core)
        if len(self.cores) == count:
            return None
        self.release()
        return holders

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # the file stays (another run may have it open): only the lock goes
        self.fds, self.cores = [], []


def _held(holders: dict[int, str]) -> str:
    by: dict[str, list[int]] = {}
    for core, holder in sorted(holders.items()):
        by.setdefault(holder, []).append(core)
    return "; ".join(f"core{'s' if len(c) > 1 else ''} {','.join(map(str, c))} held by pid {h}"
                     for h, c in by.items())
