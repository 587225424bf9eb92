"""The zygote forks its ranks: one after the other, or, for many ranks, from helper processes in parallel.

A fork of the warm zygote costs 5-8 ms (the kernel copies its page tables), so one loop over W=8192 ranks is
40-65 s (docs/benchmarks.md, session 7). With helpers, the zygote forks one helper per FORK_BATCH ranks (a
copy of itself) and each helper forks its batch: the forks run on every core at once. Every rank still ends
up the zygote's own child, with the zygote as its parent for PR_SET_PDEATHSIG:

- the zygote is a child subreaper (PR_SET_CHILD_SUBREAPER): a helper forks its batch, reports each rank's
  pid to the zygote through a pipe and exits; its ranks are then re-parented to the zygote, which reaps them
  (and their exit status) like the ranks it forked itself;
- a rank forked by a helper first waits for that (its gate pipe's end of file, then `getppid()` no longer the
  helper), sets its PDEATHSIG and checks that its parent is the zygote: if the zygote died in the meantime
  the rank exits at once. A helper dies with the zygote too (PDEATHSIG), so a capture killed while it forks
  leaves no process: the ranks of a killed helper find a parent that is not the zygote and exit;
- a helper that cannot fork (no more processes) reports it; the zygote stops the ranks forked so far and
  the launch fails with the reason (`ForkError`).

Each rank's pipes (or its output files) and control socket are made by the zygote before the helper that
forks it, a batch at a time (at most FORK_BATCH ranks' child ends open at once: `limits.fds_needed`).
`PRISM_FORK_BATCH=N` sets the batch (0: the zygote forks every rank itself); helpers are used when there
are at least two batches.
"""

from __future__ import annotations

import ctypes
import gc
import fcntl
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from prism import settings
from prism.runtime.launch import forked_rank
from prism.runtime.launch import limits
from prism.runtime.launch.zygote_spec import ZygoteSpec

_PR_SET_CHILD_SUBREAPER = 36


class ForkError(Exception):
    """A rank could not be forked (the machine's process limit, memory): the message says which and why."""


class RankForker:
    """Forks the ranks `ids` and keeps the supervisor's ends of their pipes and sockets.

    After `fork_all`: `children` (pid -> rank), `ctl` (rank -> the supervisor's end of its control socket,
    capture mode), and the ranks' output registered with `out` (pipes) or in `files`."""

    def __init__(self, spec: ZygoteSpec, ids: list[int], capture: bool, out, files, run, unlogged=()) -> None:
        self.spec, self.ids, self.capture, self.out, self.files, self.run = spec, ids, capture, out, files, run
        self.unlogged = set(unlogged)  # ids whose output is not written to the job's logs (the replay server)
        self.children: dict[int, int] = {}
        self.helpers = 0  # fork helpers used (0: the zygote forked every rank itself)
        self.ctl: dict[int, socket.socket] = {}
        # every fd from here on is the supervisor's end of some rank's pipe or socket (or a helper's pipe): a
        # new rank closes them all with one close_range (a loop over them is O(W) per rank, O(W^2) a job)
        self.first_fd = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
        self.top = self.first_fd  # the largest fd opened so far

    # -- one rank's ends ---------------------------------------------------------------------------------
    def _open(self, rank: int) -> dict:
        ends = {}
        if self.files is None:
            ends["r_out"], ends["w_out"] = os.pipe()
            ends["r_err"], ends["w_err"] = os.pipe()
        if self.capture:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            ends["parent"], ends["child"] = parent.detach(), child.detach()
        self.top = max(self.top, *ends.values()) if ends else self.top
        return ends

    def _adopt(self, rank: int, ends: dict) -> None:
        """In the zygote, once the rank's child ends were forked: close them, keep the supervisor's ends."""
        for name in ("w_out", "w_err", "child"):
            if name in ends:
                os.close(ends[name])
        if self.files is None:
            r_out, r_err = ends["r_out"], ends["r_err"]
            if self.spec.log_dir and rank not in self.unlogged:
                from prism.runtime.launch.rank_output import Tee

                log = open(Path(self.spec.log_dir) / f"rank={rank}.log", "ab")
                self.top = max(self.top, log.fileno())
                self.out.add(r_out, Tee(sys.stdout.buffer, log))
                self.out.add(r_err, Tee(sys.stderr.buffer, log))
            else:
                self.out.add(r_out, sys.stdout.buffer)
                self.out.add(r_err, sys.stderr.buffer)
        if self.capture:
            self.ctl[rank] = socket.socket(fileno=ends["parent"])

    def _become(self, rank: int, ends: dict, top: int) -> None:
        """In the forked child: become rank `rank` (never returns)."""
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            if self.files is None:
                os.dup2(ends["w_out"], 1)
                os.dup2(ends["w_err"], 2)
            else:
                self.files.attach(rank)
            if self.capture:  # the control socket moves above every supervisor fd, which are then closed
                keep = fcntl.fcntl(ends["child"], fcntl.F_DUPFD, top + 1)
                os.environ[settings.CTL_FD.name] = str(keep)
            os.closerange(self.first_fd, top + 1)
            code = self.run(rank)
        finally:
            os._exit(code)

    def _detach_sockets(self) -> None:
        """In a child: the supervisor's socket objects lose their fds (closed by close_range), so that no
        finalizer closes a number the child reuses.

        First, every object the child inherited goes to the collector's permanent generation (`gc.freeze`, a
        list splice: O(1)). The zygote froze its heap before forking, but what it made since (the ends and
        registrations of the ranks forked before this one: O(rank) objects) would otherwise be walked by the
        child's first collections, which write every such object's header: copies of the zygote's pages,
        more the later a rank is forked (private memory growing with W)."""
        gc.freeze()
        for sock in self.ctl.values():
            sock.detach()

    # -- all ranks ---------------------------------------------------------------------------------------
    def fork_all(self) -> None:
        batch = limits.fork_batch(len(self.ids))
        if batch:
            self._fork_from_helpers(batch)
            return
        for rank in self.ids:
            ends = self._open(rank)
            pid = self._fork(rank)
            if pid == 0:
                self._detach_sockets()
                self._become(rank, ends, self.top)
            self._adopt(rank, ends)
            self.children[pid] = rank

    def _fork(self, rank: int) -> int:
        try:
            return os.fork()
        except OSError as exc:
            self.stop_all()
            raise ForkError(_fork_failed(rank, exc)) from exc

    def _fork_from_helpers(self, batch: int) -> None:
        zygote = os.getpid()
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise ForkError(f"PR_SET_CHILD_SUBREAPER failed (errno {ctypes.get_errno()}): set {limits.FORK_BATCH_ENV}=0 "
                            "to fork every rank from the zygote")
        report_r, report_w = os.pipe()
        os.set_blocking(report_r, False)
        self.top = max(self.top, report_r, report_w)
        helpers: dict[int, list[int]] = {}
        text = bytearray()
        for at in range(0, len(self.ids), batch):
            part = self.ids[at:at + batch]
            ends = {rank: self._open(rank) for rank in part}
            try:
                pid = self._fork(part[0])
            except ForkError:
                self._parse(text + _drain(report_r))  # (the ranks forked so far are stopped too)
                self.stop_all()
                raise
            if pid == 0:
                self._helper(part, ends, zygote, report_r, report_w)
            helpers[pid] = part
            self.helpers += 1
            for rank in part:
                self._adopt(rank, ends[rank])
            text += _drain(report_r)
        os.close(report_w)
        failed = []
        while helpers:
            select.select([report_r], [], [], 0.05)
            text += _drain(report_r)
            for pid in list(helpers):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    helpers.pop(pid)
                    if os.waitstatus_to_exitcode(status) != 0:
                        failed.append(pid)
        text += _drain(report_r)
        os.close(report_r)
        errors = self._parse(text)
        if errors or failed or len(self.children) != len(self.ids):
            self.stop_all()
            why = errors[0] if errors else (f"a forking helper failed ({len(failed)} of them); "
                                            f"{len(self.children)} of {len(self.ids)} ranks were forked")
            raise ForkError(why)

    def _parse(self, text: bytes) -> list[str]:
        """The helpers' reports: each forked rank's pid (into `children`); returns their errors."""
        errors = []
        for line in text.decode().splitlines():
            first, second, *rest = line.split(" ", 2)
            if first == "error":
                errors.append(rest[0] if rest else line)
            else:
                self.children[int(second)] = int(first)
        return errors

    def _helper(self, part: list[int], ends: dict, zygote: int, report_r: int, report_w: int) -> None:
        """In a helper (a fork of the zygote): fork the ranks `part`, report their pids, exit (never returns)."""
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            forked_rank.die_with_parent()
            if os.getppid() != zygote:  # the zygote died before the line above
                os._exit(1)
            os.close(report_r)
            self._detach_sockets()
            me = os.getpid()
            gate_r, gate_w = os.pipe()  # end of file for this helper's ranks once it exited
            top = max(self.top, gate_r, gate_w)
            lines = []
            try:
                for rank in part:
                    pid = os.fork()
                    if pid == 0:
                        os.close(gate_w)
                        _await_reparenting(gate_r, me, zygote)
                        self._become(rank, ends[rank], top)
                    lines.append(f"{rank} {pid}\n")
                code = 0
            except OSError as exc:
                lines.append(f"error {rank} {_fork_failed(rank, exc)}\n")
            data, at = "".join(lines).encode(), 0
            while at < len(data):  # whole lines, at most PIPE_BUF bytes a write: atomic among the helpers'
                end = data.rfind(b"\n", at, at + select.PIPE_BUF) + 1
                at += os.write(report_w, data[at:end])
        finally:
            os._exit(code)

    def stop_all(self) -> None:
        """Kill and reap the ranks forked so far (a failed start)."""
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _await_reparenting(gate: int, helper: int, zygote: int) -> None:
    """In a rank forked by a helper: wait until the zygote is its parent, then die with it (PDEATHSIG)."""
    while os.read(gate, 1):  # end of file: the helper exited (it never writes)
        pass
    os.close(gate)
    while os.getppid() == helper:  # (the helper's files close before its children are re-parented)
        time.sleep(0.001)
    forked_rank.die_with_parent()
    if os.getppid() != zygote:  # the zygote died meanwhile: this rank has no supervisor
        os._exit(1)


def _drain(fd: int) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def _fork_failed(rank: int, exc: OSError) -> str:
    return (f"could not fork rank {rank} ({exc.strerror or exc}): the machine's process or memory limit "
            "(`ulimit -u`, kernel.pid_max, free memory); launch fewer ranks or raise the limit")
