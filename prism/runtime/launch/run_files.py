"""The files a launch owns: its `--out` folder (locked, empty or cleared) and its temporaries.

A job folder holds one run: launching into a folder with files in it would mix an older run's graph/,
slices/ or prism.duckdb with the new raw/, so `claim_out` refuses it unless asked to clear it (`force`).
While a launch writes to a folder it holds the folder's lock (`prism.folder_lock`, the one every command
that writes into a job folder takes; a second launch is refused at once); the kernel drops it when the
launcher dies, however it dies.

Temporaries outside `--out` (`/dev/shm/prism-<pid>-<id>`, `/tmp/prism-<pid>-<id>-*`) carry the launcher's
pid: `sweep_temporaries` removes those whose launcher is gone (killed with SIGKILL, or an older crash) and
never those of a live launcher. Staging folders inside `--out` (`.raw.tmp-*`, `.payloads.tmp-*`) are
swept by whoever holds the folder's lock: no live launch can own them then.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from prism.folder_lock import LOCK_NAME, FolderBusy, lock_folder, pid_alive, unlock_folder

SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
TEMP_NAME = re.compile(r"prism-(\d+)-[0-9a-f]{8}(?:-|$)")  # prism-<launcher pid>-<8 hex of the run id>[-...]
OUT_TEMP_NAME = re.compile(r"\.(?:raw|payloads)\.(?:tmp|old)-")  # staging and trash folders in --out


class OutError(Exception):
    """The --out folder cannot be used: the message names the cause and the fix."""


def temp_tag(run_id: str) -> str:
    """The name stem of this launch's temporaries (see TEMP_NAME)."""
    return f"prism-{os.getpid()}-{run_id[:8]}"


def sweep_temporaries(roots: list[str] | None = None) -> list[Path]:
    """Remove the temporaries of launchers that are no longer alive; returns what was removed."""
    removed = []
    for root in dict.fromkeys(roots or [SHM_ROOT, tempfile.gettempdir()]):
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            m = TEMP_NAME.match(entry.name)
            if not m or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:  # removed meanwhile by another sweep, or not ours to remove
                continue
            removed.append(Path(entry.path))
    return removed


class OutFolder:
    """A claimed --out folder: locked, swept of dead runs' staging, empty (or cleared with `force`).

    `release(failed=True)` also removes the folder if this claim created it and it is still empty, so a
    run that failed leaves no empty --out behind."""

    def __init__(self, path: Path, force: bool) -> None:
        self.path = path
        self.lock_fd: int | None = None
        self.created = _missing_ancestors(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._sweep_staging()
            self._make_empty(force)
        except OSError as exc:
            self.release(failed=True)
            raise OutError(f"--out {path} is not writable ({exc.strerror}); choose another folder") from None
        except OutError:
            self.release(failed=True)
            raise

    def _lock(self) -> None:
        try:
            self.lock_fd = lock_folder(self.path, lambda holder: f"--out {self.path} is in use by another prism "
                                       f"launch (pid {holder}); wait for it to finish, or choose another --out",
                                       "prism launch")
        except FolderBusy as exc:
            raise OutError(str(exc)) from None

    def _sweep_staging(self) -> None:
        for entry in self.path.iterdir():
            if OUT_TEMP_NAME.match(entry.name):
                shutil.rmtree(entry, ignore_errors=True)

    def _make_empty(self, force: bool) -> None:
        entries = sorted(e for e in self.path.iterdir() if e.name != LOCK_NAME)
        if not entries:
            return
        if not force:
            names = ", ".join(e.name for e in entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise OutError(f"--out {self.path} is not empty ({names}): a job folder holds one run, and an older "
                           "run's files would be read as this one's; choose a new folder, or add --force to "
                           "clear it")
        here = Path.cwd().resolve()
        if self.path.resolve() in (here, *here.parents, Path.home().resolve()):
            raise OutError(f"--force would clear {self.path}, which holds the current folder or is the home "
                           "folder; choose a job folder of its own")
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def release(self, failed: bool) -> None:
        """Drop the lock (and its file); after a failure, remove the folders this claim created if empty."""
        if self.lock_fd is not None:
            unlock_folder(self.path, self.lock_fd)
            self.lock_fd = None
        if failed:
            for folder in self.created:  # deepest first
                try:
                    folder.rmdir()
                except OSError:
                    break


def _missing_ancestors(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet, deepest first."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing
