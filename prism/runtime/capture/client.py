"""Capture mode, rank side: this rank's link to the coordinator, and the ops in flight.

A rank issues a collective (`capture.transport`) by writing its contribution to a shared-memory file and
telling the coordinator it arrived; the rank keeps running. Waiting on it (`CaptureWork.wait`, or a drain
point: the end of a backward pass, an optimizer step, the end of the program — where torch itself would wait
on futures prism cannot see) gives the device slot back (`CaptureClient.block`) and blocks until the
coordinator says every member arrived and a slot is free again; then the rank computes its own outputs from
the members' contributions and completes the op's future.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import time
from pathlib import Path

import pyarrow as pa
import torch

from prism import job_paths, settings
from prism import schemas
from prism.runtime import memory, shm
from prism.runtime.work_parts import OwnResult


_client: "CaptureClient | None" = None
SHARED = "-sum"  # a collective's file of its value, left by the member that computed it (`CaptureTransport._reduced`)


class GroupCount:
    """The capture transports this rank created, and those it linked to the coordinator (their first op):
    capture_stats.json's groups_created / groups_used (a test's window on laziness)."""

    created = 0
    linked = 0


def key_name(key: tuple) -> str:
    """File-name stem of a communication key."""
    return "-".join(str(p) for p in key).replace("/", "_")


def linked() -> bool:
    """Whether this process is a capture rank with a live link to the coordinator."""
    return _client is not None


def client() -> "CaptureClient":
    global _client
    if _client is None:
        _client = CaptureClient.from_env()
    return _client


class CaptureClient:
    """This rank's link to the coordinator (one per process)."""

    def __init__(self, rank: int, fd: int, shm_dir: Path, payload_dir: Path | None, trace_dir: Path | None,
                 cores: list[int]) -> None:
        self.rank = rank
        self.sock = socket.socket(fileno=fd)
        self.shm_dir = shm_dir
        self._shm = str(shm_dir)  # the files' names are made as strings (`file`)
        self.payloads = shm.PayloadStore(payload_dir) if payload_dir else None
        self.trace_dir = trace_dir
        self.cores = cores
        self.pending: list["CaptureWork"] = []
        self.payload_rows: list[tuple] = []
        self.slot = -1
        self.blocks = 0
        self.blocked_ns = 0
        self.switches = 0  # blocks whose results were ready: the round trip is the context-switch cost
        self.switch_ns = 0
        # private bytes when the rank first had its slot back (its set-up over: the program's groups made, its
        # first collectives issued; after the trim of that wait): the end's private minus this is its steps'
        self.private_first_block = -1

    @classmethod
    def from_env(cls) -> "CaptureClient":
        payloads, trace = settings.PAYLOADS.get(), settings.OUT.get()
        return cls(int(os.environ["RANK"]), settings.CTL_FD.get(), Path(settings.SHM_DIR.get()),
                   Path(payloads) if payloads else None, Path(trace) if trace else None, settings.CORES.get())

    # -- control -------------------------------------------------------------------------------------
    def send(self, msg: tuple) -> None:
        self.sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def _await_go(self) -> bool:
        """Wait for a slot; returns whether the coordinator granted it at once (a pure context switch)."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise SystemExit("prism capture: the coordinator went away")
        msg = pickle.loads(data)
        assert msg[0] == "go", msg
        slot = msg[1]
        if slot != self.slot:
            self.slot = slot
            os.sched_setaffinity(0, {self.cores[slot % len(self.cores)]})
        return msg[2]

    def start(self) -> None:
        """Called once in the forked rank: wait for a first device slot."""
        torch.set_num_threads(1)
        self.send(("hello",))
        self._await_go()

    def block(self, keys: list[tuple]) -> None:
        """Give the slot back until every key completed and a slot is ours again."""
        start = time.monotonic_ns()
        # with the device memory this rank holds (what a swap would move; 0 before it uses CUDA)
        held = torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0
        self.send(("wait", keys, time.thread_time_ns(), held))
        memory.trim()  # while the coordinator decides: free C heap pages go back (~1 MiB a rank)
        immediate = self._await_go()
        spent = time.monotonic_ns() - start
        if not self.blocks:
            self.private_first_block = memory.private_bytes()
        self.blocks += 1
        self.blocked_ns += spent
        if immediate:
            self.switches += 1
            self.switch_ns += spent

    def drain(self) -> bool:
        """Complete every pending op (torch may be about to wait on their futures); True if it blocked."""
        pending, self.pending = self.pending, []
        pending = [w for w in pending if not w.completed]
        if not pending:
            return False
        waiting = [k for w in pending if not w.ready() for k in w.keys]
        if waiting:
            self.block(waiting)
        for w in pending:
            w.finish()
        return bool(waiting)

    def finish(self, code: int) -> None:
        if code == 0:
            self.drain()
            self.write_rank_files()
        self.send(("exit", code))

    # -- data ------------------------------------------------------------------------------------------
    def contribute(self, key: tuple, suffix: str, tensors: list[torch.Tensor], meta: dict | None,
                   work_id: int) -> int:
        data = shm.encode(tensors, meta)
        shm.write(self.file(key, suffix), data)
        if self.payloads is not None:
            digest = self.payloads.put(data)
            self.payload_rows.append((self.rank, work_id, key_name(key), "in", digest, len(data)))
        return len(data)

    def keep_result(self, key: tuple, tensors: list[torch.Tensor], work_id: int) -> None:
        """Store this rank's result of a reduction whose value depends on the reduction order (floating
        point, > 2 members): a slice run reproduces it bitwise (`prism.runtime.slice.transport`), where the real
        backend's order would differ in the last bits (and data-dependent programs, MoE routing, diverge)."""
        if self.payloads is None or not any(t.is_floating_point() for t in tensors):
            return
        data = shm.encode(tensors)
        self.payload_rows.append((self.rank, work_id, key_name(key), "out", self.payloads.put(data), len(data)))

    def path(self, key: tuple, suffix: str) -> Path:
        return self.shm_dir / f"{key_name(key)}{suffix}"

    def file(self, key: tuple, suffix: str) -> str:
        """`path` as a string, for the files a rank makes and reads per op: a `Path` interns its name
        (`shm.write`), one per contribution read, i.e. per member of every collective this rank folds."""
        return f"{self._shm}/{key_name(key)}{suffix}"

    def read(self, key: tuple, suffix: str) -> tuple[dict, list[torch.Tensor]]:
        return shm.read(self.file(key, suffix))

    def write_rank_files(self) -> None:
        """This rank's payload index and capture statistics, next to its trace."""
        if self.trace_dir is None:
            return
        folder = self.trace_dir / f"rank={self.rank}"
        folder.mkdir(parents=True, exist_ok=True)
        from prism.runtime.capture import nonmember_groups

        stats = {"rank": self.rank, "blocks": self.blocks, "blocked_ns": self.blocked_ns,
                 "switches": self.switches, "switch_ns": self.switch_ns, "logical_ns": time.thread_time_ns(),
                 "process_cpu_ns": time.process_time_ns(),  # every thread's: what else the rank ran
                 "private_bytes": memory.private_bytes(), "private_bytes_first_block": self.private_first_block,
                 "groups_created": GroupCount.created,
                 "groups_used": GroupCount.linked, "nonmember_groups_answered": nonmember_groups.answered}
        (folder / "capture_stats.json").write_text(json.dumps(stats))
        profile = settings.MEMORY_PROFILE.get()  # a profiling aid: scripts/rank_memory.py
        if profile:
            pages: list[int] = []
            where = memory.private_by_kind(os.getppid(), pages)
            where["objects"] = memory.copied_by_object(pages)
            Path(profile, f"rank={self.rank}.json").write_text(json.dumps(where))
        schema = schemas.with_version(schemas.RAW_PAYLOADS)
        table = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in self.payload_rows], schema=schema)
        tmp = folder / "payloads.arrow.tmp"
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table)
        os.replace(tmp, job_paths.stream_file(folder, "payloads"))


class _CaptureFuture(torch.futures.Future):
    """The future of a capture op: a Python `wait()`/`value()` on it waits through the coordinator (giving
    the slot back) instead of blocking while holding it. (torch's C++ waits use the drain points.)"""

    def __init__(self, work: "CaptureWork") -> None:
        super().__init__()
        self._work = work  # dropped when the op completes (no cycle keeps its tensors alive)

    def wait(self):
        if self._work is not None:
            self._work.wait()
        return super().wait()

    def value(self):
        if self._work is not None:
            self._work.wait()
        return super().value()

    def then(self, callback):
        """A chained future (`get_future().then(f).wait()`) waits through the coordinator too."""
        child = _CaptureFuture(self._work)

        def run(fut):
            try:
                child.set_result(callback(fut))
            except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the chained future
                child.set_exception(exc)

        self.add_done_callback(run)
        return child


class _JoinedFuture(torch.futures.Future):
    """`torch.futures.collect_all` of futures some of which are capture ops': its `wait()` first waits
    for those ops through the coordinator."""

    def __init__(self, joined: torch.futures.Future, works: list["CaptureWork"]) -> None:
        super().__init__()
        self._works = works
        joined.add_done_callback(lambda f: self.set_result(f.value()))

    def wait(self):
        for work in self._works:
            work.wait()
        return super().wait()

    def value(self):
        for work in self._works:
            work.wait()
        return super().value()


def install_future_helpers() -> None:
    """`torch.futures.wait_all` / `collect_all` wait in C++: over capture ops they would block the rank
    while it holds its device slot (a hang the coordinator cannot see). In capture mode they first wait
    for the capture ops through the coordinator."""
    futures = torch.futures
    if getattr(futures.wait_all, "_prism", False):
        return
    original_wait_all, original_collect_all = futures.wait_all, futures.collect_all

    def works_of(futs) -> list[CaptureWork]:
        return [f._work for f in futs if isinstance(f, _CaptureFuture)]

    def wait_all(futs):
        for work in works_of(futs):
            work.wait()
        return original_wait_all(futs)

    def collect_all(futs):
        joined = original_collect_all(futs)
        works = works_of(futs)
        return _JoinedFuture(joined, works) if works else joined

    wait_all._prism = collect_all._prism = True
    futures.wait_all, futures.collect_all = wait_all, collect_all


class Contributions:
    """The files of the members' contributions to collective `key` that a rank reads (`members`: group
    ranks, a range for all of them), each path made when looked at: an op in flight then holds O(1) objects,
    not a path per member (~0.5 MiB a dp all-reduce of 2,048 members, held until it completes)."""

    __slots__ = ("client", "key", "members")

    def __init__(self, client_: CaptureClient, key: tuple, members) -> None:
        self.client, self.key, self.members = client_, key, members

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return (self.client.path(self.key, f"-r{i}") for i in self.members)

    def ready(self) -> bool:
        """Whether this rank can complete the op at once: its value is already shared, or every contribution
        is there. The members are looked at last first: the slots run ranks in rank order, so a collective
        still incomplete misses its last members, found at the first look instead of after every member
        that arrived (O(1) a waiting member, not O(members))."""
        stem = self.client.file(self.key, "")
        if os.path.exists(stem + SHARED):
            return True
        return all(os.path.exists(f"{stem}-r{i}") for i in reversed(self.members))


class CaptureWork(OwnResult):
    """An op in flight: completes (outputs written, future set) when waited on or drained."""

    def __init__(self, client_: CaptureClient, keys: list[tuple], complete, result,
                 needs: list[str] | Contributions | None = None) -> None:
        self.client = client_
        self.keys = keys
        self.needs = needs  # files whose presence means the result can be computed (None: ask)
        self._complete = complete  # computes and writes this rank's outputs
        self._result = result
        # made when asked for: a work and its future refer to each other, and until a garbage collection
        # that cycle would keep the op's tensors alive longer than the native backend does
        self._future: _CaptureFuture | None = None
        self.completed = False
        if not keys or (needs is not None and len(needs) == 0):
            self.finish()
        else:
            client_.pending.append(self)

    def ready(self) -> bool:
        """Every contribution this rank needs is already there: no need to give the slot back."""
        if isinstance(self.needs, Contributions):
            return self.needs.ready()
        return self.needs is not None and all(os.path.exists(p) for p in self.needs)

    def finish(self) -> None:
        if self.completed:
            return
        self.completed = True
        if self._complete is not None:
            with torch.no_grad():  # a backend writes results into tensors outside autograd (leaf buffers too)
                self._complete()
            self._complete = None
        if self.keys:
            self.client.send(("done", self.keys))
        if self._future is not None:
            self._future.set_result(self._result)
            self._future._work = None

    @property
    def future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = _CaptureFuture(self)
            if self.completed:
                self._future.set_result(self._result)
                self._future._work = None
        return self._future

    def wait(self, timeout=None) -> bool:
        if not self.completed:
            self.client.pending = [w for w in self.client.pending if w is not self]
            if not self.ready():
                self.client.block(self.keys)
            self.finish()
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future

    def _source_rank(self) -> int:
        return getattr(self, "source", -1)

    def is_completed(self) -> bool:
        return self.completed
