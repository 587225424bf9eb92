"""A capture spread over hosts, in one host's coordinator: which arrivals go to which host, and what comes in.

`coordinator_link` calls `outgoing` for each of its ranks' arrivals (before the coordinator handles it), and
`incoming` when the bridge (`host_bridge`) has frames from other hosts. A collective's contribution goes to
every other host with a member of its group (each reads every member's contribution, as on one host); a send
goes to its receiver's host, and is then finished here (nobody on this host reads it). Recvs and any-source
recvs are matched where their receiver runs, so they go nowhere.

A hang over hosts: this host's ranks all wait, and for `PRISM_HOST_HANG_S` seconds (default 60) no frame
came from another host: the coordinator's diagnosis is reported (the ranks of other hosts appear as
"runs on another host"; their own host names what they wait for).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from prism import settings
from prism.runtime.capture.client import key_name
from prism.runtime.capture.host_bridge import HostBridge

HANG_ENV = settings.HOST_HANG_S.name
DEFAULT_HANG_S = settings.HOST_HANG_S.default


class HostRoute:
    def __init__(self, store, view, hosts: list[dict], shm_dir: Path) -> None:
        self.view, self.shm_dir = view, shm_dir
        self.me = view.node_rank
        self.bridge = HostBridge(store, view, hosts, shm_dir)
        self._hosts_of: dict[str, tuple[int, ...]] = {}  # group name -> the other hosts with a member
        self.hang_s = float(os.environ.get(HANG_ENV) or DEFAULT_HANG_S)
        self.last_word = time.monotonic()
        self.stuck_since: float | None = None
        self.forwarded = self.received = 0
        self.failed_peer = False

    def _other_hosts(self, group: str, members: tuple) -> tuple[int, ...]:
        hosts = self._hosts_of.get(group)
        if hosts is None:
            hosts = tuple(sorted({self.view.host_of(m) for m in members} - {self.me}))
            self._hosts_of[group] = hosts
        return hosts

    def outgoing(self, rank: int, msg: tuple) -> None:
        _, key, members, info = msg
        if key[0] == "c":
            targets = self._other_hosts(key[1], tuple(members))
            if not targets:
                return
            suffix = f"-r{list(members).index(rank)}"
        elif key[0] == "p" and info[4] == "send" and self.view.host_of(key[3]) != self.me:
            targets, suffix = (self.view.host_of(key[3]),), ""
        else:
            return
        path = self.shm_dir / f"{key_name(key)}{suffix}"
        data = path.read_bytes() if info[3] or path.exists() else b""
        for host in targets:
            self.bridge.forward(host, ("arrive", rank, key, tuple(members), tuple(info), suffix), data)
            self.forwarded += 1

    def sent_away(self, coord, msg: tuple) -> list[str]:
        """After the coordinator handled a send to another host: it is finished here (returns its file)."""
        _, key, _, info = msg
        if key[0] != "p" or info[4] != "send" or self.view.host_of(key[3]) == self.me:
            return []
        coord.keys.pop(key, None)
        waiting = coord.unclaimed.get((key[1], key[3], key[4]))
        if waiting and key in waiting:
            waiting.remove(key)
        return [str(self.shm_dir / key_name(key))]

    def incoming(self, coord) -> tuple[list, str | None]:
        replies, error = [], None
        for msg in self.bridge.drain():
            self.last_word = time.monotonic()
            if msg[0] == "arrive":
                _, rank, key, members, info, _ = msg
                self.received += 1
                replies += coord.arrive_remote(rank, key, members, info)
            elif (why := self.bridge.peer_error(msg, "the capture")) is not None:
                self.failed_peer = True
                error = error or why
        return replies, error

    def hang(self, coord) -> str | None:
        now = time.monotonic()
        if not coord.stuck():
            self.stuck_since = None
            return None
        if self.stuck_since is None:
            self.stuck_since = now
        if now - max(self.stuck_since, self.last_word) < self.hang_s:
            return None
        return (coord.diagnose() + f"\n  (on host {self.me}; no word from the other hosts for {self.hang_s:g} s, "
                f"{HANG_ENV})")

    def close(self, coord, reason: str | None) -> None:
        if reason is None and coord.crashed:
            failed = [(r, coord.ranks[r].exit_code) for r in self.view.ranks()
                      if coord.ranks[r].exit_code not in (0, None) or coord.ranks[r].state != "exited"]
            r, code = failed[0] if failed else (None, None)
            reason = f"rank {r} failed (exit code {code})" if r is not None else "a rank failed"
        if reason is None and not coord.all_exited():
            reason = "its ranks were stopped"
        self.bridge.close(None if self.failed_peer and reason is None else reason)

    def stats(self) -> dict:
        return {"frames_out": self.forwarded, "frames_in": self.received, "bytes_out": self.bridge.bytes_sent}
