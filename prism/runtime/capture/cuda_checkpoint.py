"""The CUDA driver's checkpoint API, from outside the process it moves: a rank's device state to host memory
and back (`cuCheckpointProcessLock/Checkpoint/Restore/Unlock`, libcuda, driver R570 or newer).

The calls run in a small helper process (`python -m prism.runtime.capture.cuda_checkpoint`, no torch): the zygote,
which hosts capture's coordinator, must never initialise CUDA itself (ranks forked after that could not
use it), and the driver API needs `cuInit` in the calling process. The helper reads one request a line
on stdin -- `suspend PID` (lock, then checkpoint: the process's device memory goes to host memory and its
device allocations are released) or `resume PID` (restore, then unlock) -- and answers `ok SECONDS` or
`error MESSAGE`. A lock waits at most LOCK_TIMEOUT_MS for the process's in-flight GPU work; a helper that
does not answer within REPLY_TIMEOUT_S is an error, never a hang.
"""

from __future__ import annotations

import ctypes
import os
import select
import subprocess
import sys
import time

from prism import settings

LOCK_TIMEOUT_MS = 20_000
REPLY_TIMEOUT_S = 300.0
FUNCTIONS = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
             "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class CheckpointError(RuntimeError):
    """The checkpoint API is missing or one of its calls failed (the message names the cause)."""


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class Driver:
    """libcuda's checkpoint functions (in the helper process)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CheckpointError(f"the CUDA driver library libcuda.so.1 cannot be loaded ({exc}): swapping "
                                  "device state needs an NVIDIA driver on this host") from None
        version = ctypes.c_int(0)
        self._check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        missing = [f for f in FUNCTIONS if not hasattr(self.lib, f)]
        if missing:
            v = version.value
            raise CheckpointError(f"this CUDA driver (API {v // 1000}.{v % 1000 // 10}) has no checkpoint API "
                                  f"({', '.join(missing)} missing): swapping device state (--device-memory-gb) "
                                  "needs driver R570 or newer; update the driver or drop --device-memory-gb")
        self._check(self.lib.cuInit(0), "cuInit")

    def _check(self, result: int, what: str, pid: int | None = None) -> None:
        if result == 0:
            return
        text = ctypes.c_char_p()
        self.lib.cuGetErrorString(result, ctypes.byref(text))
        who = f" of process {pid}" if pid is not None else ""
        raise CheckpointError(f"{what}{who} failed: CUDA error {result} "
                              f"({text.value.decode() if text.value else 'unknown'})")

    def state(self, pid: int) -> str:
        st = ctypes.c_int(-1)
        self._check(self.lib.cuCheckpointProcessGetState(pid, ctypes.byref(st)), "cuCheckpointProcessGetState", pid)
        return STATES.get(st.value, str(st.value))

    def suspend(self, pid: int) -> None:
        args = _LockArgs(timeoutMs=LOCK_TIMEOUT_MS)
        self._check(self.lib.cuCheckpointProcessLock(pid, ctypes.byref(args)), "cuCheckpointProcessLock", pid)
        self._check(self.lib.cuCheckpointProcessCheckpoint(pid, None), "cuCheckpointProcessCheckpoint", pid)

    def resume(self, pid: int) -> None:
        self._check(self.lib.cuCheckpointProcessRestore(pid, None), "cuCheckpointProcessRestore", pid)
        self._check(self.lib.cuCheckpointProcessUnlock(pid, None), "cuCheckpointProcessUnlock", pid)


def serve() -> int:
    """The helper's loop: `ready` (or `error ...` and exit 1), then one answer per request."""
    try:
        driver = Driver()
    except CheckpointError as exc:
        print(f"error {exc}", flush=True)
        return 1
    print("ready", flush=True)
    for line in sys.stdin:
        action, _, pid = line.strip().partition(" ")
        t0 = time.monotonic()
        try:
            if action not in ("suspend", "resume", "state"):
                raise CheckpointError(f"unknown request {line.strip()!r}")
            answer = getattr(driver, action)(int(pid))
            print(f"ok {time.monotonic() - t0:.6f} {answer or ''}".rstrip(), flush=True)
        except CheckpointError as exc:
            print(f"error {exc}", flush=True)
    return 0


class Checkpointer:
    """The coordinator's side: starts the helper and asks it to move processes' device state."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env.pop(settings.MODE.name, None)  # a plain Python process, prism's interception not installed
        self.proc = subprocess.Popen([sys.executable, "-m", "prism.runtime.capture.cuda_checkpoint"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        first = self._reply(60.0)
        if first != "ready":
            self.close()
            raise CheckpointError(first.removeprefix("error "))

    def _reply(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            code = self.proc.poll()
            raise CheckpointError("the CUDA checkpoint helper " + (f"exited with code {code}" if code is not None
                                                                    else f"did not answer within {timeout:g} s"))
        return line.strip()

    def request(self, action: str, pid: int) -> tuple[float, str]:
        """Run `action` on process `pid`; returns (seconds it took, its answer)."""
        self.proc.stdin.write(f"{action} {pid}\n")
        self.proc.stdin.flush()
        reply = self._reply(REPLY_TIMEOUT_S)
        if not reply.startswith("ok "):
            raise CheckpointError(reply.removeprefix("error "))
        _, secs, *rest = reply.split(" ", 2)
        return float(secs), (rest[0] if rest else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def probe() -> str | None:
    """Why device state cannot be swapped on this host (None when it can)."""
    try:
        Checkpointer().close()
    except CheckpointError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    sys.exit(serve())
