"""A capture spread over hosts: the coordinators' gloo group, through which ranks of different hosts meet.

Each host's coordinator (`coordinator_link`) schedules its own ranks on its own slots. When one of its ranks
arrives at a collective that has members on other hosts, its contribution (the shared-memory file the rank
wrote) and the arrival go, through this bridge, to every other host with a member; a send to a rank of
another host goes to that host. There the bridge writes the file into the host's shared-memory folder under
the same name and hands the arrival to the coordinator, so the ranks there read it as a local peer's: the
rank side of a capture does not know about hosts. The bytes move by gloo send/recv (TCP) among the
coordinators (one process a host), never through the store, which only serves gloo's rendezvous.

Frames (host -> host, one sender thread, one receiver thread per peer, in order): an int64 pair (header
bytes, data bytes), the pickled header, the data. Headers:
    ("arrive", rank, key, members, info, suffix)   a rank's arrival, with its contribution as data
    ("fail", reason)                                this host stops (a rank failed, a limit): so do you
    ("bye",)                                        this host's ranks all finished; nothing more comes
A peer whose connection breaks (its host died, its coordinator was killed) is reported by name.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import threading
from datetime import timedelta
from pathlib import Path

import torch

IDLE_TIMEOUT = timedelta(hours=24)  # a gloo recv waits this long for the next frame (a dead peer fails at once)


class HostBridge:
    def __init__(self, store, view, hosts: list[dict], shm_dir: Path) -> None:
        import torch.distributed as dist

        self.view, self.hosts, self.shm_dir = view, hosts, shm_dir
        self.me = view.node_rank
        prefix = dist.PrefixStore("prism/bridge/", store)
        self.pg = dist.ProcessGroupGloo(prefix, self.me, view.nnodes, IDLE_TIMEOUT)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # for the coordinator's thread
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self.finished: set[int] = set()  # peers that said bye (their ranks need nothing more)
        self.bytes_sent = self.frames_sent = 0
        self._closing = False
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name="prism-bridge-send")
        self._sender.start()
        self._receivers = [threading.Thread(target=self._recv_loop, args=(k,), daemon=True,
                                            name=f"prism-bridge-recv{k}")
                           for k in range(view.nnodes) if k != self.me]
        for t in self._receivers:
            t.start()

    def name(self, host: int) -> str:
        return f"host {host} ({self.hosts[host]['hostname']})"

    # -- out -------------------------------------------------------------------------------------------
    def forward(self, host: int, header: tuple, data: bytes = b"") -> None:
        self._out.put((host, header, data))

    def _send_loop(self) -> None:
        while (item := self._out.get()) is not None:
            host, header, data = item
            if host in self.finished and header[0] == "arrive":
                continue  # its ranks are gone: nobody there reads it
            try:
                self._send(host, header, data)
            except RuntimeError as exc:
                self._post(("gone", host, _first_line(exc)))
                if header[0] != "arrive":
                    continue

    def _send(self, host: int, header: tuple, data: bytes) -> None:
        head = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
        sizes = torch.tensor([len(head), len(data)], dtype=torch.int64)
        self.pg.send([sizes], host, 0).wait()
        self.pg.send([torch.frombuffer(bytearray(head), dtype=torch.uint8)], host, 0).wait()
        if data:
            self.pg.send([torch.frombuffer(bytearray(data), dtype=torch.uint8)], host, 0).wait()
        self.frames_sent += 1
        self.bytes_sent += len(data)

    # -- in --------------------------------------------------------------------------------------------
    def _recv_loop(self, host: int) -> None:
        from prism.runtime import shm
        from prism.runtime.capture.client import key_name

        while True:
            try:
                sizes = torch.zeros(2, dtype=torch.int64)
                self.pg.recv([sizes], host, 0).wait()
                head = torch.empty(int(sizes[0]), dtype=torch.uint8)
                self.pg.recv([head], host, 0).wait()
                header = pickle.loads(head.numpy().tobytes())
                data = b""
                if int(sizes[1]):
                    buf = torch.empty(int(sizes[1]), dtype=torch.uint8)
                    self.pg.recv([buf], host, 0).wait()
                    data = buf.numpy().tobytes()
            except RuntimeError as exc:
                if not self._closing or host not in self.finished:
                    self._post(("gone", host, _first_line(exc)))
                return
            if header[0] == "arrive" and data:
                _, rank, key, _, _, suffix = header
                shm.write(f"{self.shm_dir}/{key_name(key)}{suffix}", data)  # before the coordinator hears of it
            if header[0] in ("bye", "fail"):
                self.finished.add(host)
            self._post(header if header[0] != "fail" else ("fail", host, header[1]))
            if header[0] in ("bye", "fail"):
                return

    def peer_error(self, msg: tuple, during: str) -> str | None:
        """What a "fail" or "gone" message from the inbox says, in one line (None: any other message, or the
        link of a peer that said bye, closing): `during` names the run ("the capture", "the emulation")."""
        if msg[0] == "fail":
            return f"{self.name(msg[1])} stopped its ranks: {msg[2]}; this host's ranks were stopped too"
        if msg[0] == "gone" and not (msg[1] in self.finished and self._closing):
            return (f"{self.name(msg[1])} went away during {during} (its link broke: {msg[2]}): the host or its "
                    "launcher died; every host's ranks are stopped")
        return None

    def _post(self, msg: tuple) -> None:
        self.inbox.put(msg)
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def drain(self) -> list[tuple]:
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        msgs = []
        while True:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                return msgs

    # -- end -------------------------------------------------------------------------------------------
    def close(self, reason: str | None) -> None:
        """Tell every peer this host is done (or failed, with `reason`), then wait until every peer said so
        too (a peer still running may still send: its frames are read and dropped)."""
        self._closing = True
        for k in range(self.view.nnodes):
            if k != self.me:
                self.forward(k, ("fail", reason) if reason else ("bye",))
        self._out.put(None)
        self._sender.join()
        for t in self._receivers:
            while t.is_alive():
                t.join(0.5)
                if os.getppid() == 1:  # the launcher is gone: nobody waits for this host any more
                    return
        self.wake_r.close()
        self.wake_w.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
