"""Capture mode, in the zygote: the coordinator's state machine (`coordinator.Coordinator`, no I/O) wired to
the ranks' control sockets. It reads their messages, sends the replies, moves device state, renames and
deletes the shared-memory files of finished operations, and hosts the job's rendezvous store."""

from __future__ import annotations

import json
import os
import pickle
import queue
import selectors
import shutil
import threading
import time
from pathlib import Path

from prism.runtime.launch.rank_output import LineForwarder
from prism.runtime.launch.zygote_spec import ZygoteSpec


class CoordinatorLink:
    """Capture mode: the coordinator's state machine wired to the ranks' control sockets."""

    def __init__(self, spec: ZygoteSpec, ctl: dict, out: LineForwarder) -> None:
        import torch.distributed as dist

        from prism.runtime.capture.coordinator import Coordinator

        from prism.runtime.capture import device_state

        # device state: kept where it is, or (CUDA with --device-memory-gb) swapped to host when needed
        capacity = spec.device_memory_bytes
        self.devices = device_state.for_device(spec.device, capacity)
        policy = device_state.SwapPolicy(spec.devices, capacity) if capacity else None
        # a capture over hosts: this host's ranks, the others' through the bridge
        self.view = None
        if spec.hosts is not None:
            from prism.runtime.launch.hosts import HostView

            self.view = HostView.from_dict(spec.hosts)
        self.coord = Coordinator(spec.nproc, spec.devices, policy=policy, sticky=self.devices.sticky,
                                 local=self.view.ranks() if self.view else None)
        self.pids = spec.pids
        self.immortal = spec.immortal
        self.heap_holes = spec.heap_holes
        self.fork_s = spec.fork_s
        self.warm_s = spec.warm_s
        self.fork_helpers = spec.fork_helpers
        self.socks = ctl
        self.shm_dir = Path(spec.shm_dir)
        self.status_dir = Path(spec.status_dir)
        self.error: str | None = None
        self.last_progress = time.monotonic()
        self.started = (time.monotonic(), time.process_time())  # the coordinator's wall and CPU from here
        # the rendezvous store lives here, so no rank (which may be waiting for a slot) has to serve it (over
        # hosts: in host 0's launcher, for as long as any host runs)
        self.store = dist.TCPStore(spec.master_addr, spec.master_port, spec.nproc,
                                   is_master=self.view is None, wait_for_workers=False)
        from prism.runtime.capture.client import SHARED, key_name
        from prism.runtime.capture.coordinator import CaptureError

        self._key_name, self._errors = key_name, (CaptureError, device_state.SwapError)
        self._shared = SHARED
        # the finished operations' files are deleted by a thread (an unlink releases the GIL): the
        # coordinator's one thread goes on with the next message meanwhile
        self._doomed: queue.SimpleQueue = queue.SimpleQueue()
        self._unlinker = threading.Thread(target=_unlink_all, args=(self._doomed,), daemon=True,
                                          name="prism-shm-unlink")
        self._unlinker.start()
        self._shm = str(self.shm_dir)
        for rank, sock in ctl.items():
            out.sel.register(sock.fileno(), selectors.EVENT_READ, lambda r=rank: self.on_readable(r))
        self.sel = out.sel
        self.route = None
        if self.view is not None:
            from prism.runtime.capture.host_route import HostRoute

            self.route = HostRoute(self.store, self.view, spec.host_records, self.shm_dir)
            out.sel.register(self.route.bridge.wake_r.fileno(), selectors.EVENT_READ, self.on_bridge)

    def on_readable(self, rank: int) -> None:
        sock = self.socks[rank]
        try:
            data = sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        try:
            if not data:
                self.sel.unregister(sock.fileno())
                self.coord.exited(rank, None)  # no "exit" message first: the rank crashed
                replies = self.coord.schedule()
            else:
                msg = pickle.loads(data)
                if self.route is not None and msg[0] == "arrive":
                    self.route.outgoing(rank, msg)
                replies = self.coord.handle(rank, msg)
                if self.route is not None and msg[0] == "arrive":
                    self._dropped(self.route.sent_away(self.coord, msg))
        except self._errors as exc:
            self.error = str(exc)
            return
        self._apply(replies)

    def on_bridge(self) -> None:
        """Arrivals from other hosts (their files already here), or a host that stopped."""
        try:
            replies, error = self.route.incoming(self.coord)
        except self._errors as exc:
            self.error = str(exc)
            return
        if error and self.error is None:
            self.error = error
        self._apply(replies)

    def poll(self) -> None:
        """Called by the supervisor now and then: over hosts, a hang is named once this host's ranks all
        waited, with no word from the other hosts, for the host hang time (`host_route`)."""
        if self.route is not None and self.error is None and not self.coord.crashed:
            self.error = self.route.hang(self.coord)

    def error_code(self) -> int:
        """The exit code of a capture stopped by `error`: 86 (a hang or mismatch here), or 1 when it was
        another host that failed or went away."""
        from prism.runtime import watchdog

        return 1 if self.route is not None and self.route.failed_peer else watchdog.HANG_EXIT_CODE

    def _dropped(self, paths: list[str]) -> None:
        if paths:
            self._doomed.put(paths)

    def _apply(self, replies: list) -> None:
        key_name = self._key_name
        for p_key, a_key in self.coord.file_moves:  # a message received by an any-source recv
            try:
                os.replace(self.shm_dir / key_name(p_key), self.shm_dir / key_name(a_key))
            except FileNotFoundError:
                pass
        self.coord.file_moves.clear()
        try:
            for action, victim in self.coord.device_actions:  # device state moves before anyone runs
                getattr(self.devices, action)(self.pids[victim], self.coord.footprint[victim])
        except self._errors as exc:
            self.error = str(exc)
            return
        finally:
            self.coord.device_actions.clear()
        for peer, msg in replies:
            try:
                self.socks[peer].send(pickle.dumps(msg))
            except OSError:
                pass
        if self.coord.finished_keys:
            paths = []
            for key in self.coord.finished_keys:
                stem = f"{self._shm}/{key_name(key)}"
                if key[0] in ("p", "a"):
                    paths.append(stem)
                else:
                    paths += [f"{stem}-r{i}" for i in range(self._group_size(key))] + [stem + self._shared]
            self._doomed.put(paths)
            self.coord.finished_keys.clear()
        if self.error is None and not self.coord.crashed and self.coord.stuck() and self.route is None:
            # (a crashed rank is reported by the supervisor with its traceback instead)
            self.error = self.coord.diagnose()

    def _group_size(self, key: tuple) -> int:
        return len(self.coord.groups.get(key[1], (None, ()))[1]) or 0

    def close(self, reason: str | None = None) -> None:
        if self.route is not None:  # the other hosts hear whether this one finished or failed, and why
            self.route.close(self.coord, reason or self.error)
        stats = dict(self.coord.stats(), **self.devices.stats())
        if self.route is not None:
            stats["bridge"] = self.route.stats()
        # the coordinator's (this process's) CPU seconds against the wall from the forks to the end: near 1,
        # the single coordinator thread is what bounds the capture
        stats["coordinator_wall_s"] = round(time.monotonic() - self.started[0], 3)
        stats["coordinator_cpu_s"] = round(time.process_time() - self.started[1], 3)
        stats["fork_s"] = self.fork_s
        stats["fork_helpers"] = self.fork_helpers  # processes that forked the ranks in parallel (rank_fork)
        if self.immortal is not None:  # what the zygote did before the fork (prism.runtime.launch.immortal)
            stats["immortal"] = self.immortal
        if self.heap_holes is not None:  # the C heap's free chunks it took (prism.runtime.memory.fill_heap_holes)
            stats["heap_holes"] = self.heap_holes
        self.devices.close()
        self._doomed.put(None)
        self._unlinker.join(timeout=30)
        # where the wall went: the zygote's warm-up and forks, then the coordinator's phases (`Coordinator.phases`)
        stats["phases_s"] = {"warm": self.warm_s, "fork": self.fork_s,
                             **self.coord.phases(self.started[0], time.monotonic())}
        (self.status_dir / "capture_stats.json").write_text(json.dumps(stats))
        for sock in self.socks.values():
            sock.close()
        shutil.rmtree(self.shm_dir, ignore_errors=True)


def _unlink_all(doomed: queue.SimpleQueue) -> None:
    """The unlinking thread: delete each list of files put on `doomed` (None: stop)."""
    while (paths := doomed.get()) is not None:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
