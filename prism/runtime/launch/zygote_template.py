"""A warm template of the zygote, kept between launches: each launch's zygote is a fork of it instead of a new
interpreter that imports torch again.

A zygote's start is mostly the import of torch and of prism's interception (which imports torch._dynamo): ~2.3 s
of a 3.9 s W=2 truth run of the fidelity bench here, 6-11 s a launch on the 16-core host (docs/benchmarks.md, "the
fidelity bench's fixed cost per config"). Something that launches many jobs in a row (`prism bench fidelity`) starts
one template

    python -m prism.runtime.launch.zygote_template SOCKET      (`Template.start` does it)

and sets PRISM_ZYGOTE_TEMPLATE=SOCKET for its launches. The template imports what a new zygote has imported when
its `sitecustomize` installs the interception (prism's zygote module, torch, the interception module) and what
`zygote.warm_imports` imports next (pyarrow, with its first conversion), with the environment a new zygote has at
that moment, and installs nothing. A launch
(`launcher._supervise_zygote`) sends it the zygote's spec file, environment, working folder and cores, its
stdin/stdout/stderr and a lifeline (a pipe's read end whose writer is the launcher); the template forks, and the
child becomes the zygote (`become_zygote`): the launcher's descriptors on 0-2, its environment, folder and
cores, the interception installed for the launch's mode (what `sitecustomize` does at the end of `import
torch`), then `zygote.main` from its first line. So the zygote, and every rank it forks, is what a new zygote
would have made; only the imports done before the first fork are not repeated.

It is used only for a launch on one host (the launcher's choice) that fits (`mismatch`): the same Python, a mode
that records, and the same environment at the import of torch but for prism's own variables (PRISM_*, read at run time only) and the few torch variables
the launcher sets per mode and torch reads at run time (`PER_RUN`). Otherwise, or when the template is not
there, the launcher starts a new zygote as always. The zygote's parent is the template: it dies with the
template (PR_SET_PDEATHSIG) and, through the lifeline, with the launcher; its exit status reaches the launcher
through the template (`TemplateZygote`, which the launcher handles as the `Popen` of a new zygote).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from prism import settings

# the variables the launcher sets per launch and torch reads at run time (not at import): allowed to differ
PER_RUN = ("TORCHELASTIC_USE_AGENT_STORE", "TORCH_DIST_INIT_BARRIER", "TORCH_GLOO_LAZY_INIT")
_MAX_MESSAGE = 1 << 20  # a request: the zygote's environment (a few KiB) and its paths


def _compared(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("PRISM_") and k not in PER_RUN}


def mismatch(template: dict, env: dict[str, str], pin: bool, executable: str) -> str | None:
    """Why a launch cannot use the template whose record is `template` (None: it can)."""
    if executable != template["executable"]:
        return f"another Python ({executable}, the template's {template['executable']})"
    if not settings.MODE.is_set(env):
        return "no recording mode (the template has imported what a recording zygote imports)"
    from prism.runtime.launch.zygote import import_environment

    mine, theirs = _compared(import_environment(env, pin)), _compared(template["env"])
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        return f"another environment at the import of torch ({', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''})"
    return None


# ------------------------------------------------------------------------------------------ the template


def serve(path: str) -> int:
    """The template's life: import what a new zygote imports, then fork a zygote for each request on `path`."""
    from prism.runtime.launch import forked_rank

    forked_rank.die_with_parent()  # (with whoever started it: the bench)
    if settings.MODE.is_set() or "torch" in sys.modules:
        print(f"[prism] zygote template: {settings.MODE.name} must not be set (the interception would be "
              "installed for one mode)", file=sys.stderr)
        return 2
    from prism.runtime.launch import zygote  # (the zygote's own imports; none of them imports torch)

    os.environ.update(zygote.import_environment(os.environ, pin=True))
    before = dict(os.environ)
    import torch  # noqa: F401
    from prism.runtime import interception  # noqa: F401  (what sitecustomize imports at the end of `import torch`)
    import pyarrow as pa  # what `zygote.warm_imports` imports next for a mode that records (`mismatch`: no others)

    pa.array([0])  # (its first conversion imports pandas)
    # what the imports set in the environment (torch: TORCHINDUCTOR_CACHE_DIR): a zygote forked from here keeps it
    by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
    record = {"executable": sys.executable, "env": before, "pid": os.getpid(), "by_imports": by_imports,
              "removed_by_imports": sorted(set(before) - set(os.environ))}

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    ready_file = Path(path + ".ready")
    ready_file.with_suffix(".tmp").write_text(json.dumps(record))
    ready_file.with_suffix(".tmp").replace(ready_file)
    # zygote pid -> the launcher's connection (for the exit status) and a pidfd that turns readable at the exit
    waiting: dict[int, tuple[socket.socket, int | None]] = {}
    while True:
        exits = [fd for _, fd in waiting.values() if fd is not None]
        poll_s = 0.1 if len(exits) < len(waiting) else 1.0  # (no pidfd here: look for exits every 0.1 s)
        ready, _, _ = select.select([listener, *exits], [], [], poll_s)
        if listener in ready:
            conn, _ = listener.accept()
            pid = _answer(conn, record, listener, waiting)
            if pid:
                waiting[pid] = (conn, _pidfd(pid))
            else:
                conn.close()
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn, fd = waiting.pop(pid, (None, None))
            if fd is not None:
                os.close(fd)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass  # the launcher is gone
                conn.close()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3 / Python 3.9: polled
        return None


def _answer(conn: socket.socket, record: dict, listener: socket.socket, waiting: dict) -> int | None:
    """One request: refuse it (a reason) or fork its zygote (its pid). Returns the pid, or None."""
    try:
        data, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 4)
        request = json.loads(data)
        why = mismatch(record, request["env"], request["pin"], request["executable"]) if len(fds) == 4 else \
            "no descriptors received"
    except (OSError, ValueError, KeyError) as exc:
        why, fds = f"a bad request ({exc})", []
    if why:
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"refused": why}).encode())
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # (3.12: "multi-threaded, use of fork()": pyarrow's allocator thread, which a
        warnings.simplefilter("ignore", DeprecationWarning)  # new zygote also has when it forks its ranks)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            listener.close()
            for other, fd in waiting.values():
                other.close()
                if fd is not None:
                    os.close(fd)
            conn.close()
            code = become_zygote(request, fds, record)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    return pid


def become_zygote(request: dict, fds: list[int], record: dict) -> int:
    """In the template's fork: take the launch's descriptors, environment (with what the template's imports set
    in it, as a new zygote's would), folder and cores, install the interception for its mode, and run the
    zygote's main."""
    from prism.runtime.launch import forked_rank, zygote

    forked_rank.die_with_parent()  # with the template; with the launcher: the lifeline (`zygote.launcher_gone`)
    stdin, stdout, stderr, lifeline = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # as a new interpreter would: line-buffered on a terminal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=os.isatty(stream.fileno()))
    here = os.getcwd()
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == here:  # `python -m`'s first entry: the working folder
        sys.path[0] = request["cwd"]
    os.environ.clear()
    os.environ.update(zygote.import_environment(request["env"], request["pin"]))
    os.environ.update(record["by_imports"])
    for name in record["removed_by_imports"]:
        os.environ.pop(name, None)
    os.sched_setaffinity(0, request["cores"])
    os.umask(request["umask"])
    try:
        os.setpgid(0, request["pgid"])  # in the launcher's process group, as a child of it is (same session only)
    except OSError:
        pass
    _fresh_random_state()
    sys.argv = [zygote.__file__, request["spec"]]
    if settings.MODE.is_set():  # what prism's sitecustomize does at the end of `import torch`
        from prism.runtime import interception

        interception.install_from_env()
    return zygote.main(lifeline)


def _fresh_random_state() -> None:
    """The random state a new interpreter draws at its imports, drawn anew: torch's default CPU generator and
    numpy's global one are seeded from the OS at import (Python's `random` reseeds itself in a fork). Not redrawn:
    the interpreter's string-hash seed (fixed at its start), which every zygote of one template shares."""
    import torch

    torch.default_generator.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


# ------------------------------------------------------------------------------------------ the launcher's side


class TemplateZygote:
    """A zygote forked by the template, handled as the launcher handles the `Popen` of a new one."""

    def __init__(self, conn: socket.socket, pid: int, lifeline: int) -> None:
        self.conn, self.pid, self._lifeline = conn, pid, lifeline
        self.returncode: int | None = None
        self._lock = threading.RLock()  # the stall watch's thread polls too

    def _read(self, timeout: float) -> int | None:
        with self._lock:
            if self.returncode is None and select.select([self.conn], [], [], timeout)[0]:
                try:
                    data = self.conn.recv(_MAX_MESSAGE)
                except OSError:
                    data = b""
                # no message: the template died, and the zygote with it (PR_SET_PDEATHSIG)
                self.returncode = json.loads(data)["exit"] if data else -signal.SIGKILL
                self.conn.close()
                os.close(self._lifeline)
            return self.returncode

    def poll(self) -> int | None:
        return self._read(0)

    def wait(self) -> int:
        while self._read(0.2) is None:
            pass
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_zygote(spec_file: Path, env: dict[str, str], pin: bool) -> TemplateZygote | None:
    """Ask the template named by PRISM_ZYGOTE_TEMPLATE for this launch's zygote; None (after saying why on
    stderr) when there is none, or it refuses the launch: the launcher then starts a new zygote."""
    path = settings.ZYGOTE_TEMPLATE.get()
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    request = {"spec": str(spec_file), "env": env, "pin": pin, "executable": sys.executable, "cwd": os.getcwd(),
               "cores": sorted(os.sched_getaffinity(0)), "umask": _umask(), "pgid": os.getpgid(0)}
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2, r])
        answer = json.loads(conn.recv(_MAX_MESSAGE) or b"{}")
    except (OSError, ValueError) as exc:
        answer = {"refused": f"not reachable ({exc})"}
    finally:
        os.close(r)
    if "pid" not in answer:
        conn.close()
        os.close(w)
        print(f"[prism] zygote template {path} not used: {answer.get('refused', 'no answer')}; a new zygote",
              file=sys.stderr, flush=True)
        return None
    return TemplateZygote(conn, answer["pid"], w)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Template:
    """A running template (`start`), stopped by `stop` (or on leaving a `with` block)."""

    def __init__(self, proc: subprocess.Popen, folder: Path) -> None:
        self.proc, self.folder = proc, folder
        self.path = str(folder / "zygote.sock")

    @classmethod
    def start(cls, env: dict[str, str], timeout: float = 120.0) -> "Template":
        """Start one with the environment `env` (the launcher's `template_environment()`); waits until it is warm."""
        folder = Path(tempfile.mkdtemp(prefix="prism-zygote-template-"))
        path = folder / "zygote.sock"
        proc = subprocess.Popen([sys.executable, "-m", "prism.runtime.launch.zygote_template", str(path)], env=env,
                                stdin=subprocess.DEVNULL)
        template = cls(proc, folder)
        ready = Path(str(path) + ".ready")
        until = time.monotonic() + timeout
        while not ready.is_file():
            if proc.poll() is not None or time.monotonic() > until:
                template.stop()
                raise RuntimeError(f"the zygote template did not start (exit {proc.poll()})")
            time.sleep(0.02)
        return template

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Template":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
