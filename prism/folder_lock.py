"""The one lock of a folder a prism command writes into, and the sweep of dead commands' temporaries.

Every command that writes into a job folder (`prism launch` on its --out, graph, slices plan/run/durations,
calibrate, emulate, summary, report, export, sql's catalog) holds an `flock` on `FOLDER/.prism.lock` while it
writes; the file holds the holder's pid and command, for the message another command gets. The kernel drops
the lock when its holder dies, however it dies. A second command on the same job waits for the first
(`PRISM_LOCK_WAIT` seconds, default 600, saying once whom it waits for; 0: refused at once) and is then
refused with one message naming the holder and the fix.

Holding the lock, a command removes the temporaries (`.NAME.tmp-PID[-ID]`, `.NAME.old-PID`) of commands whose
process is gone (killed outright): no live command of this job can own them then, and none of a live pid is
touched. Neutral: the runtime (the launcher) and the analysis stages both use it; it imports no prism module
but `prism.settings`.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import functools
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prism import settings

LOCK_NAME = ".prism.lock"
# .events.parquet.tmp-123, .emulation.old-123, .raw.tmp-123-0a1b2c3d (a launch's staging, <pid>-<run id>)
DEAD_TEMP = re.compile(r"\..+\.(?:tmp|old)-(\d+)(?:-[0-9a-f]{8})?$")
SWEEP_SKIP = {"raw", "payloads"}  # a run folder's own files: a launch sweeps its staging itself
POLL_S = 0.2


class FolderBusy(Exception):
    """Another live prism command holds the folder's lock: the message names it and the fix."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _holder(fd: int) -> str:
    """'PID' or 'PID: COMMAND', from the lock file."""
    os.lseek(fd, 0, os.SEEK_SET)
    lines = os.read(fd, 512).decode(errors="replace").split("\n")
    pid = lines[0].strip() or "unknown"
    what = lines[1].strip() if len(lines) > 1 else ""
    return f"{pid}: {what}" if what else pid


def lock_folder(folder: Path, in_use: Callable[[str], str], what: str = "", wait_s: float = 0.0,
                waiting: Callable[[str], None] | None = None) -> int:
    """Take the `flock` on `folder/.prism.lock` (writing our pid and `what` in it) and return its descriptor.
    While another live prism command holds it: wait up to `wait_s` seconds (`waiting(holder)` called once),
    then raise FolderBusy(in_use(holder)), holder being 'PID' or 'PID: COMMAND'."""
    lock_path = folder / LOCK_NAME
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if time.monotonic() >= deadline:
                raise FolderBusy(in_use(holder)) from None
            if not told and waiting is not None:
                waiting(holder)
                told = True
            time.sleep(POLL_S)
            continue
        try:  # the holder before us may have removed the file after we opened it: lock the current one
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n{what}\n".encode())
    return fd


def unlock_folder(folder: Path, fd: int) -> None:
    """Drop a lock taken by `lock_folder` (and its file)."""
    try:
        os.unlink(folder / LOCK_NAME)
    except FileNotFoundError:
        pass
    os.close(fd)


def sweep_dead(folder: Path, depth: int = 3) -> list[Path]:
    """Remove, under `folder` (down to `depth` levels, not inside raw/ or payloads/), the temporaries of
    commands whose process is gone; returns what was removed. Call it holding the folder's lock."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = DEAD_TEMP.match(entry.name)
        if m:
            pid = int(m.group(1))
            if pid != os.getpid() and not pid_alive(pid):
                try:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
                    removed.append(Path(entry.path))
                except OSError:
                    pass
            continue
        if depth > 1 and entry.name not in SWEEP_SKIP and entry.is_dir(follow_symlinks=False):
            removed += sweep_dead(Path(entry.path), depth - 1)
    return removed


def wait_s() -> float:
    """How long a command waits for a job folder another command holds (`PRISM_LOCK_WAIT`)."""
    return max(0.0, settings.LOCK_WAIT.get())


@contextmanager
def holding(job: Path, command: str) -> Iterator[None]:
    """`command` (e.g. 'prism graph') holds the job folder `job` while the block runs: the lock (waiting for
    another command as `wait_s` says, else FolderBusy), then the dead temporaries swept. A folder that does not
    exist or cannot be written is left to the command (it reports what it cannot read or write)."""
    job = Path(job)
    if not job.is_dir():
        yield
        return

    def told(holder: str) -> None:
        print(f"{command}: {job} is in use by another prism run (pid {holder}); waiting for it (up to "
              f"{wait_s():g} s, {settings.LOCK_WAIT.name})", file=sys.stderr, flush=True)

    try:
        fd = lock_folder(job, lambda holder: f"{job} is in use by another prism run (pid {holder}); wait for "
                         f"it to finish (waited {wait_s():g} s: {settings.LOCK_WAIT.name}=S waits longer)",
                         command, wait_s(), told)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            yield  # a read-only job: this command writes elsewhere (--out), or says why it cannot
            return
        raise
    try:
        sweep_dead(job)
        yield
    finally:
        unlock_folder(job, fd)


def run_holding(job: Path, command: str, body: Callable[[], int]) -> int:
    """A stage's `main` after its arguments: `body()` while holding `job`; a busy folder is one line, exit 2."""
    try:
        with holding(job, command):
            return body()
    except FolderBusy as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2


def _job_argument(argv: list[str]) -> Path | None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--job", type=Path)
    try:
        return parser.parse_known_args(argv)[0].job
    except SystemExit:  # `--job` without a value: the stage's own parser says so
        return None


def locks_job(command: str):
    """Decorate a stage's `main(argv)`: it runs holding its `--job` folder (`holding`); a busy folder is one
    line naming the holder, exit 2. Without --job (or with --help) it runs as is."""
    def wrap(main):
        @functools.wraps(main)
        def locked(argv: list[str] | None = None) -> int:
            job = _job_argument(sys.argv[1:] if argv is None else list(argv))
            if job is None:
                return main(argv)
            return run_holding(job, command, lambda: main(argv))
        return locked
    return wrap
