"""Capture mode, rank side: the transport that moves data through shared memory under the coordinator.

Issuing a collective writes this rank's contribution to a shared-memory file and tells the coordinator
it arrived; the rank keeps running. Waiting on it (`Work.wait`, or a drain point: the end of a backward
pass, an optimizer step, the end of the program — where torch itself would wait on futures prism cannot
see) gives the device slot back and blocks until the coordinator says every member arrived and a slot is
free again; then the rank computes its own outputs from the members' contributions (`semantics`) and
completes the op's future. Sends are buffered: a send completes once its data is written.
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
import torch.distributed as dist

from prism import schemas
from prism.runtime import memory, semantics, shm

_client: "CaptureClient | None" = None


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

    @classmethod
    def from_env(cls) -> "CaptureClient":
        env = os.environ
        payloads = env.get("PRISM_PAYLOADS") or None
        trace = env.get("PRISM_OUT") or None
        cores = [int(c) for c in env["PRISM_CORES"].split(",")]
        return cls(int(env["RANK"]), int(env["PRISM_CTL_FD"]), Path(env["PRISM_SHM_DIR"]),
                   Path(payloads) if payloads else None, Path(trace) if trace else None, cores)

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
        immediate = self._await_go()
        spent = time.monotonic_ns() - start
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
        shm.write(self.shm_dir / f"{key_name(key)}{suffix}", data)
        if self.payloads is not None:
            digest = self.payloads.put(data)
            self.payload_rows.append((self.rank, work_id, key_name(key), "in", digest, len(data)))
        return len(data)

    def keep_result(self, key: tuple, tensors: list[torch.Tensor], work_id: int) -> None:
        """Store this rank's result of a reduction whose value depends on the reduction order (floating
        point, > 2 members): a slice run reproduces it bitwise (`prism.runtime.slicing`), where the real
        backend's order would differ in the last bits (and data-dependent programs, MoE routing, diverge)."""
        if self.payloads is None or not any(t.is_floating_point() for t in tensors):
            return
        data = shm.encode(tensors)
        self.payload_rows.append((self.rank, work_id, key_name(key), "out", self.payloads.put(data), len(data)))

    def path(self, key: tuple, suffix: str) -> Path:
        return self.shm_dir / f"{key_name(key)}{suffix}"

    def read(self, key: tuple, suffix: str) -> tuple[dict, list[torch.Tensor]]:
        return shm.read(self.path(key, suffix))

    def write_rank_files(self) -> None:
        """This rank's payload index and capture statistics, next to its trace."""
        if self.trace_dir is None:
            return
        folder = self.trace_dir / f"rank={self.rank}"
        folder.mkdir(parents=True, exist_ok=True)
        stats = {"rank": self.rank, "blocks": self.blocks, "blocked_ns": self.blocked_ns,
                 "switches": self.switches, "switch_ns": self.switch_ns, "logical_ns": time.thread_time_ns(),
                 "private_bytes": memory.private_bytes(), "groups_created": CaptureTransport.created,
                 "groups_used": CaptureTransport.linked}
        (folder / "capture_stats.json").write_text(json.dumps(stats))
        schema = schemas.with_version(schemas.RAW_PAYLOADS)
        table = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in self.payload_rows], schema=schema)
        tmp = folder / "payloads.arrow.tmp"
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            writer.write_table(table)
        os.replace(tmp, folder / "payloads.arrow")


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


class CaptureWork:
    """An op in flight: completes (outputs written, future set) when waited on or drained."""

    def __init__(self, client_: CaptureClient, keys: list[tuple], complete, result,
                 needs: list[Path] | None = None) -> None:
        self.client = client_
        self.keys = keys
        self.needs = needs  # files whose presence means the result can be computed (None: ask)
        self._complete = complete  # computes and writes this rank's outputs
        self._result = result
        # made when asked for: a work and its future refer to each other, and until a garbage collection
        # that cycle would keep the op's tensors alive longer than the native backend does
        self._future: _CaptureFuture | None = None
        self.completed = False
        if not keys or needs == []:
            self.finish()
        else:
            client_.pending.append(self)

    def ready(self) -> bool:
        """Every contribution this rank needs is already there: no need to give the slot back."""
        return self.needs is not None and all(p.exists() for p in self.needs)

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

    def is_success(self) -> bool:
        return self.completed

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self) -> None:
        self.wait()


def _shapes(result) -> list:
    """Shapes (nested like the op's outputs) of a result: what a replay must allocate."""
    if isinstance(result, torch.Tensor):
        return tuple(result.shape)
    return [_shapes(r) for r in result]


class CaptureTransport:
    """The transport of one process group in capture mode.

    Lazy: a group costs its rank nothing until the rank uses it (Megatron-style programs create every
    group of the job in every rank and use a handful): the coordinator hears of the group, and the
    per-peer counters exist, only from the group's first op on."""

    __slots__ = ("group", "me", "members", "n", "desc", "seq", "_c", "_sent", "_received", "_received_any")
    created = 0  # groups this rank created / linked (a test's window on laziness)
    linked = 0

    def __init__(self, group_name: str, group_rank: int, members: list[int], desc: str | None) -> None:
        self.group = group_name
        self.me = group_rank
        self.members = tuple(members)
        self.n = len(members)
        self.desc = desc
        self.seq = 0
        self._c = None
        self._sent = self._received = self._received_any = None
        CaptureTransport.created += 1

    @property
    def c(self) -> CaptureClient:
        if self._c is None:  # first use: now the coordinator needs the group's description
            self._c = client()
            self._c.send(("group", self.group, self.desc, self.members))
            CaptureTransport.linked += 1
        return self._c

    @property
    def sent(self) -> dict[tuple[int, int], int]:
        if self._sent is None:
            self._sent = {}
        return self._sent

    @property
    def received(self) -> dict[tuple[int, int], int]:
        if self._received is None:
            self._received = {}
        return self._received

    @property
    def received_any(self) -> dict[int, int]:
        if self._received_any is None:
            self._received_any = {}
        return self._received_any

    def start_coalescing(self, device) -> None:
        pass

    def end_coalescing(self, device):
        return None

    def call(self, method: str, device, *args, work_id: int = -1, op: str = "") -> CaptureWork:
        handler = getattr(self, "_" + method, None)
        if handler is None:
            raise RuntimeError(f"prism capture does not support {method} yet")
        return handler(work_id, op, *args)

    # -- collectives -------------------------------------------------------------------------------------
    def _collective(self, op: str, work_id: int, mine: list[torch.Tensor] | None, complete, result,
                    meta: dict | None = None, info_tensors: list[torch.Tensor] | None = None,
                    reads: list[int] | None | str = "all") -> CaptureWork:
        """Contribute `mine`, announce the arrival; `reads`: the members whose contributions this rank
        reads to complete ("all", a list, [] when it completes at once, None when only the coordinator
        can tell, e.g. a barrier)."""
        key = ("c", self.group, self.seq)
        self.seq += 1
        nbytes = 0
        # what a replay of this contribution needs besides the bytes: the op, and the outputs' shapes
        meta = dict(meta or {}, op=op, out=_shapes(result))
        if mine is not None:
            nbytes = self.c.contribute(key, f"-r{self.me}", mine, meta, work_id)
        first = (info_tensors or mine or [None])[0]
        info = (op, str(first.dtype).removeprefix("torch.") if first is not None else None,
                "x".join(map(str, first.shape)) if first is not None else None, nbytes, "member")
        self.c.send(("arrive", key, self.members, info))
        if reads == "all":
            reads = list(range(self.n))
        needs = None if reads is None else [self.c.path(key, f"-r{i}") for i in reads]
        return CaptureWork(self.c, [key], lambda: complete(key), result, needs)

    def _keep(self, key: tuple, outputs, work_id: int) -> None:
        """A reduction's result, kept for slice runs where its value depends on the order (> 2 members)."""
        if self.n > 2:
            self.c.keep_result(key, list(outputs), work_id)

    def _inputs(self, key: tuple, members=None):
        """The members' contributions, read one at a time (group order): a rank holds one member's bytes
        at once, not the group's (its memory stays flat in the group size, hence in W)."""
        for i in (range(self.n) if members is None else members):
            yield self.c.read(key, f"-r{i}")

    def _fold(self, key: tuple, red, pick) -> list[torch.Tensor]:
        """`semantics.reduce` of each tensor `pick(member's tensors)[j]` over the members, streamed."""
        folds = None
        for _, ts in self._inputs(key):
            picked = pick(ts)
            folds = folds or [semantics.Fold(red) for _ in picked]
            for f, t in zip(folds, picked):
                f.add(t)
        return [f.result() for f in folds or []]

    def _allreduce(self, work_id, op, tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            for t, r in zip(tensors, self._fold(key, red, lambda ts: ts)):
                t.copy_(r)
            self._keep(key, tensors, work_id)

        return self._collective(op, work_id, list(tensors), complete, list(tensors), meta={"reduce_op": red.name})

    _allreduce_coalesced = _allreduce

    def _allgather(self, work_id, op, output_tensors, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                for j, out in enumerate(output_tensors):
                    out[k].copy_(ts[j])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors)

    def _all_gather_single(self, work_id, op, output, input, opts):
        def complete(key):
            rows = output.view(self.n, -1)
            for k, (_, ts) in enumerate(self._inputs(key)):
                rows[k].copy_(ts[0].reshape(-1))

        return self._collective(op, work_id, [input], complete, [output])

    def _reduce_scatter(self, work_id, op, output_tensors, input_tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            mine = [j * self.n + self.me for j in range(len(output_tensors))]
            for out, r in zip(output_tensors, self._fold(key, red, lambda ts: [ts[i] for i in mine])):
                out.copy_(r)
            self._keep(key, output_tensors, work_id)

        flat = [t for lst in input_tensors for t in lst]
        return self._collective(op, work_id, flat, complete, output_tensors, meta={"reduce_op": red.name})

    def _reduce_scatter_single(self, work_id, op, output, input, opts):
        red = semantics.red_op(opts)

        def complete(key):
            chunk = self._fold(key, red, lambda ts: [ts[0].reshape(self.n, -1)[self.me]])[0]
            output.copy_(chunk.view_as(output))
            self._keep(key, [output], work_id)

        return self._collective(op, work_id, [input], complete, [output], info_tensors=[input],
                                meta={"reduce_op": red.name})

    def _alltoall_base(self, work_id, op, output, input, output_split_sizes, input_split_sizes, opts):
        def complete(key):
            got = list(self._inputs(key))
            ins = [ts[0] for _, ts in got]
            splits = [meta["splits"] for meta, _ in got]
            output.copy_(semantics.all_to_all_single(ins, splits, self.me).view_as(output))

        return self._collective(op, work_id, [input], complete, [output],
                                meta={"splits": list(input_split_sizes), "out_splits": list(output_split_sizes)})

    def _alltoall(self, work_id, op, output_tensors, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                output_tensors[k].copy_(ts[self.me])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors)

    def _broadcast(self, work_id, op, tensors, opts):
        root = opts.rootRank

        def complete(key):
            if self.me != root:
                _, ts = self.c.read(key, f"-r{root}")
                for t, src in zip(tensors, ts):
                    t.copy_(src)

        mine = list(tensors) if self.me == root else None
        return self._collective(op, work_id, mine, complete, list(tensors), info_tensors=list(tensors),
                                reads=[] if self.me == root else [root])

    def _reduce(self, work_id, op, tensors, opts):
        red, root = semantics.red_op(opts), opts.rootRank

        def complete(key):
            if self.me == root:
                for t, r in zip(tensors, self._fold(key, red, lambda ts: ts)):
                    t.copy_(r)
                self._keep(key, tensors, work_id)

        return self._collective(op, work_id, list(tensors), complete, list(tensors),
                                reads="all" if self.me == root else [], meta={"reduce_op": red.name, "root": root})

    def _gather(self, work_id, op, output_tensors, input_tensors, opts):
        root = opts.rootRank

        def complete(key):
            if self.me == root:
                for k, (_, ts) in enumerate(self._inputs(key)):
                    output_tensors[0][k].copy_(ts[0])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors,
                                reads="all" if self.me == root else [])

    def _scatter(self, work_id, op, output_tensors, input_tensors, opts):
        root = opts.rootRank

        def complete(key):
            _, ts = self.c.read(key, f"-r{root}")
            output_tensors[0].copy_(ts[self.me])

        mine = list(input_tensors[0]) if self.me == root else None
        return self._collective(op, work_id, mine, complete, output_tensors, info_tensors=list(output_tensors),
                                reads=[root])

    def _barrier(self, work_id, op, opts):
        return self._collective(op, work_id, None, lambda key: None, [], reads=None)

    def _allgather_coalesced(self, work_id, op, output_lists, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                for j, out in enumerate(output_lists[k]):
                    out.copy_(ts[j])

        return self._collective(op, work_id, list(input_tensors), complete, output_lists)

    # -- point to point ------------------------------------------------------------------------------------
    def _send(self, work_id, op, tensors, dst, tag):
        peer = self.members[dst]
        k = self.sent.get((peer, tag), 0)
        self.sent[(peer, tag)] = k + 1
        key = ("p", self.group, self.members[self.me], peer, tag, k)
        nbytes = self.c.contribute(key, "", list(tensors), {"src": self.me}, work_id)
        t = tensors[0]
        self.c.send(("arrive", key, (self.members[self.me], peer),
                     (op, str(t.dtype).removeprefix("torch."), "x".join(map(str, t.shape)), nbytes, "send")))
        return CaptureWork(self.c, [], None, list(tensors))

    def _recv(self, work_id, op, tensors, src, tag):
        peer = self.members[src]
        k = self.received.get((peer, tag), 0)
        self.received[(peer, tag)] = k + 1
        key = ("p", self.group, peer, self.members[self.me], tag, k)
        t = tensors[0]
        self.c.send(("arrive", key, (peer, self.members[self.me]),
                     (op, str(t.dtype).removeprefix("torch."), "x".join(map(str, t.shape)), 0, "recv")))

        def complete(key):
            _, ts = self.c.read(key, "")
            for t, src_t in zip(tensors, ts):
                t.copy_(src_t)

        return CaptureWork(self.c, [key], lambda: complete(key), list(tensors), [self.c.path(key, "")])

    def _recv_anysource(self, work_id, op, tensors, tag):
        """A recv from whichever rank sends first (the coordinator pairs it; the data says who)."""
        me = self.members[self.me]
        k = self.received_any.get(tag, 0)
        self.received_any[tag] = k + 1
        key = ("a", self.group, me, tag, k)
        t = tensors[0]
        self.c.send(("arrive", key, (me,),
                     (op, str(t.dtype).removeprefix("torch."), "x".join(map(str, t.shape)), 0, "recv")))
        work = None

        def complete():
            meta, ts = self.c.read(key, "")
            for t_, src_t in zip(tensors, ts):
                t_.copy_(src_t)
            src = meta["src"]
            peer = self.members[src]
            self.received[(peer, tag)] = self.received.get((peer, tag), 0) + 1  # it consumed that message
            work.source = src

        work = CaptureWork(self.c, [key], complete, list(tensors), [self.c.path(key, "")])
        return work
