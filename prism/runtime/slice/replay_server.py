"""Mode `slice`, the replay server: answers for every rank outside the slice from the recorded payloads.

The ranks of a slice run the real program on the real transport (`transport.RealTransport` over
`transport.slice_store`). One replay server process stands in for all other (virtual) ranks: for every
group that holds a slice rank and a virtual one, it creates one `ProcessGroupGloo` per virtual member
(same store key space, that member's group rank and the group's size; the members of a group are built
concurrently, since a gloo rendezvous waits for all of them). Groups without a slice rank are never
created (group reduction); with lazy gloo (TORCH_GLOO_LAZY_INIT=1, the launcher's default above W=64) only
the virtual members that communicate with a slice rank are, and groups that never communicate are not
(lazy gloo connects a pair on its first op and does not wait for the other members at creation). Then, per group, one thread replays the group's collectives in `group_seq`
order: every virtual member issues the op on its own instance with its recorded contribution as input
(reduce op, root, splits and output shapes come from the payload's meta) and the outputs are discarded.
Point-to-point messages between a virtual and a slice rank are replayed per channel (group, sender,
receiver, tag) in the recorded order: virtual -> slice sends carry the recorded payload, slice -> virtual
messages are received into buffers shaped like the slice rank's recorded send. Payloads are loaded ahead
of use (a small prefetch per thread).

Values: the data comes from the capture, the reductions are gloo's. For groups of two members that equals
the capture bitwise (addition commutes); for larger groups gloo's reduction order differs from prism's
(`semantics`), so results agree within float rounding, as a real gloo run does.

Timed (`--timed-by TIMELINE`, a timed slice run): the virtual ranks follow a calibrated timeline on the clock
emulation uses (`timed_replay.TimedReplay`: their calibrated program order, durations and transfers, from a
common start taken when the server starts); each op with a slice rank is issued once every virtual member
arrived at it on that clock (`gate`) and reported complete when it completed (`complete`), so virtual peers
answer when they would in the real job and the slice ranks wait as they would there. The server then writes
when it issued each of those ops (`raw/replay/issues.arrow`: comm_id, t_issue_ns on the host monotonic
clock): a transfer measured in the slice starts at the last issue of all members, replayed ones included.
Untimed (the default), every op is issued as soon as the group's previous one completed.

Inputs (the capture folder, `prism launch --mode capture --out DIR`): `raw/meta.json`,
`raw/rank=R/{groups,events,payloads}.arrow`, `payloads/<hash[:2]>/<hash>.bin`.

Run by the supervisor of `prism launch --mode slice` (forked from the zygote): `serve(...)`. When it has
replayed everything it waits to be told to stop (SIGTERM); stopped before that, it prints what it still
waits for (the group, op and sequence number of each unfinished replay).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from prism.runtime import shm
from prism.runtime.capture.client import key_name
from prism.runtime.transport import slice_store

PREFETCH = 4  # payloads loaded ahead of use, per replay thread
IN_FLIGHT = 8  # a group's collectives issued and not yet complete, at most (the job queues them the same way)
_alive: list = []
_END = object()


class ReplayError(Exception):
    """The capture cannot be replayed for this slice (missing files, a payload the op needs)."""


# -- reading the capture ---------------------------------------------------------------------------------
def _read_stream(path: Path) -> pa.Table:
    if not path.is_file():
        raise ReplayError(f"{path}: missing (is this a complete capture with payloads?)")
    with pa.OSFile(str(path)) as source:
        return ipc.open_stream(source).read_all()


@dataclass
class Collective:
    seq: int
    op: str
    root: int  # group rank of the root (broadcast, reduce, gather, scatter), else -1
    key: str


@dataclass
class Channel:
    """The messages of one (group, sender, receiver, tag), in the order they were sent."""

    group: str
    src: int  # global ranks
    dst: int
    tag: int
    hashes: list[str] = field(default_factory=list)  # the sender's recorded payloads, in order


@dataclass
class ReplayPlan:
    """What the server must do for one slice."""

    world: int
    slice_ranks: list[int]
    groups: dict[str, tuple[int, ...]]  # every relevant group: name -> members (global ranks)
    order: list[str]  # relevant groups in creation order
    collectives: dict[str, list[Collective]]
    payload: dict[tuple[int, str], str]  # (global rank, key) -> hash
    channels: list[Channel]

    def virtual(self, group: str) -> list[int]:
        return [r for r in self.groups[group] if r not in self.slice_ranks]

    def to_build(self, group: str, lazy: bool) -> list[int]:
        """The virtual members the server must create. Eager gloo waits for every member at creation: all
        of them. Lazy gloo (TORCH_GLOO_LAZY_INIT=1) connects a pair on its first op: only the members that
        communicate with a slice rank (every member if the group has collectives, else the peers of its
        messages); a group that never communicates is not created at all."""
        if not lazy or self.collectives[group]:
            return self.virtual(group)
        peers = {ch.src if ch.src not in self.slice_ranks else ch.dst for ch in self.channels if ch.group == group}
        return [r for r in self.virtual(group) if r in peers]


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def load_plan(capture: Path, slice_ranks: list[int]) -> ReplayPlan:
    """Read the capture: the groups, collectives and messages that involve a slice rank and a virtual one."""
    raw = capture / "raw"
    meta_path = raw / "meta.json"
    if not meta_path.is_file():
        raise ReplayError(f"{meta_path}: missing (not a capture folder, or the capture did not finish)")
    world = int(json.loads(meta_path.read_text())["world_size"])
    slice_set = set(slice_ranks)
    groups: dict[str, tuple[int, ...]] = {}
    # a group holding a slice rank is in that rank's groups table
    for r in slice_ranks:
        for name, members in zip(*_read_stream(raw / f"rank={r}" / "groups.arrow")
                                 .select(["group", "members"]).to_pydict().values()):
            members = tuple(members)
            if any(m not in slice_set for m in members):
                groups[name] = members
    order = sorted(groups, key=_group_order)

    # the collectives of each relevant group, from one slice member's events (every member issues them all)
    collectives: dict[str, list[Collective]] = {g: [] for g in groups}
    seen_by: dict[str, int] = {}
    peers: set[int] = set()
    for r in slice_ranks:
        ev = _read_stream(raw / f"rank={r}" / "events.arrow").select(["kind", "op", "group", "group_seq", "peer"])
        cols = ev.to_pydict()
        for kind, op, group, gseq, peer in zip(cols["kind"], cols["op"], cols["group"], cols["group_seq"],
                                               cols["peer"]):
            if kind in ("send", "recv") and group in groups:
                if peer < 0:  # a recv from any source records its sender once it completed
                    raise ReplayError(f"{raw / f'rank={r}' / 'events.arrow'}: a {op} without its sender "
                                      "(captured by an older prism, or never waited on): capture again")
                peers.add(peer)
            if kind != "collective" or group not in groups or seen_by.setdefault(group, r) != r:
                continue
            members = groups[group]
            root = members.index(peer) if op in ("broadcast", "reduce", "gather", "scatter") else -1
            collectives[group].append(Collective(gseq, op, root, key_name(("c", group, gseq))))
    for ops in collectives.values():
        ops.sort(key=lambda c: c.seq)

    # the payload indexes: of the slice ranks (their sends to virtual ranks, roots' shapes), of the virtual
    # members of groups with collectives, and of the virtual peers of the slice ranks' messages
    readers = set(slice_set)
    for g, ops in collectives.items():
        if ops:
            readers.update(groups[g])
    readers.update(p for p in peers if p not in slice_set)
    payload: dict[tuple[int, str], str] = {}
    channels: dict[tuple[str, int, int, int], list[tuple[int, str]]] = defaultdict(list)
    for r in sorted(readers):
        table = _read_stream(raw / f"rank={r}" / "payloads.arrow").select(["key", "role", "hash"]).to_pydict()
        for key, role, digest in zip(table["key"], table["role"], table["hash"]):
            if role != "in":  # results kept for the slice ranks themselves (prism.runtime.slice.transport)
                continue
            if key.startswith("c-"):
                payload[(r, key)] = digest
                continue
            # p2p key: p-<group>-<src>-<dst>-<tag>-<k>
            group, src, dst, tag, k = _split_p2p(key)
            if group not in groups or (src in slice_set) == (dst in slice_set):
                continue
            channels[(group, src, dst, tag)].append((k, digest))
    chans = []
    for (group, src, dst, tag), items in sorted(channels.items()):
        items.sort()
        chans.append(Channel(group, src, dst, tag, [h for _, h in items]))
    return ReplayPlan(world, list(slice_ranks), groups, order, collectives, payload, chans)


def _split_p2p(key: str) -> tuple[str, int, int, int, int]:
    head, src, dst, tag, k = key.rsplit("-", 4)
    return head[2:], int(src), int(dst), int(tag), int(k)


# -- replaying one op --------------------------------------------------------------------------------------
def _red(meta: dict) -> dist.ReduceOp:
    return getattr(dist.ReduceOp, meta.get("reduce_op", "SUM"))


def _opts(cls, **attrs):
    opts = cls()
    for name, value in attrs.items():
        setattr(opts, name, value)
    return opts


def _empty(shapes, dtype) -> list:
    """Buffers nested like `shapes` (tuples are shapes, lists are lists)."""
    if isinstance(shapes, tuple):
        return torch.empty(shapes, dtype=dtype)
    return [_empty(s, dtype) for s in shapes]


def issue(pg: ProcessGroupGloo, op: str, me: int, n: int, root: int, mine: tuple[dict, list] | None,
          root_payload: tuple[dict, list] | None):
    """Issue collective `op` on a virtual member's instance with its recorded contribution; returns the work."""
    meta, ts = mine if mine is not None else ({}, [])
    dtype = ts[0].dtype if ts else (root_payload[1][0].dtype if root_payload and root_payload[1] else None)
    out = meta.get("out")
    if op == "all_reduce":
        return pg.allreduce(ts, _opts(dist.AllreduceOptions, reduceOp=_red(meta)))
    if op == "all_reduce_coalesced":
        return pg.allreduce_coalesced(ts, _opts(dist.AllreduceCoalescedOptions, reduceOp=_red(meta)))
    if op == "all_gather":
        return pg.allgather(_empty(out, dtype), ts)
    if op == "all_gather_into_tensor":
        return pg._allgather_base(_empty(out[0], dtype), ts[0])
    if op == "reduce_scatter":
        per = len(ts) // n
        inputs = [ts[j * n:(j + 1) * n] for j in range(per)]
        return pg.reduce_scatter(_empty(out, dtype), inputs, _opts(dist.ReduceScatterOptions, reduceOp=_red(meta)))
    if op == "reduce_scatter_tensor":
        return pg._reduce_scatter_base(_empty(out[0], dtype), ts[0],
                                       _opts(dist.ReduceScatterOptions, reduceOp=_red(meta)))
    if op == "all_gather_coalesced":  # out: [source rank][input]; each input keeps its dtype
        return pg.allgather_coalesced([[torch.empty(s, dtype=t.dtype) for s, t in zip(per, ts)] for per in out], ts)
    if op == "all_to_all_single":
        return pg.alltoall_base(_empty(out[0], dtype), ts[0], list(meta["out_splits"]), list(meta["splits"]),
                                dist.AllToAllOptions())
    if op == "all_to_all":
        return pg.alltoall(_empty(out, dtype), ts, dist.AllToAllOptions())
    if op == "broadcast":
        tensors = ts if me == root else [torch.empty_like(t) for t in root_payload[1]]
        return pg.broadcast(tensors, _opts(dist.BroadcastOptions, rootRank=root, rootTensor=0))
    if op == "reduce":
        return pg.reduce(ts, _opts(dist.ReduceOptions, reduceOp=_red(meta), rootRank=int(meta.get("root", root))))
    if op == "gather":
        return pg.gather(_empty(out, dtype) if me == root else [], ts, _opts(dist.GatherOptions, rootRank=root))
    if op == "scatter":
        src = root_payload[1]
        return pg.scatter([torch.empty_like(src[me])], [ts] if me == root else [],
                          _opts(dist.ScatterOptions, rootRank=root))
    if op == "barrier":
        return pg.barrier(dist.BarrierOptions())
    raise ReplayError(f"the replay server cannot replay {op!r} yet")


class _PollingStore(dist.Store):
    """A store client shared by many members that rendezvous at once: a blocking get or wait would hold
    the client (and block every other member's set), so it polls `check` instead."""

    POLL_S = 0.002

    def __init__(self, base, lock: threading.Lock) -> None:
        super().__init__()
        self.base, self.lock = base, lock

    def _await(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.base.timeout).total_seconds()
        deadline = time.monotonic() + limit
        while True:
            with self.lock:
                if self.base.check(keys):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the store did not get keys {keys} within {limit:.0f} s")
            time.sleep(self.POLL_S)

    def set(self, key, value):
        with self.lock:
            self.base.set(key, value)

    def get(self, key):
        self._await([key])
        with self.lock:
            return self.base.get(key)

    def wait(self, keys, timeout=None):
        self._await(list(keys), timeout)

    def check(self, keys):
        with self.lock:
            return self.base.check(keys)

    def add(self, key, amount):
        with self.lock:
            return self.base.add(key, amount)

    def compare_set(self, key, expected, desired):
        with self.lock:
            return self.base.compare_set(key, expected, desired)

    def delete_key(self, key):
        with self.lock:
            return self.base.delete_key(key)

    def num_keys(self):
        with self.lock:
            return self.base.num_keys()


# -- the server ----------------------------------------------------------------------------------------------
class ReplayServer:
    def __init__(self, plan: ReplayPlan, capture: Path, timeout: timedelta) -> None:
        self.plan = plan
        self.payloads = shm.PayloadStore(capture / "payloads")
        self.timeout = timeout
        self.pgs: dict[str, dict[int, ProcessGroupGloo]] = {}
        self.loader = ThreadPoolExecutor(max_workers=2, thread_name_prefix="prism-replay-load")
        self.errors: list[str] = []
        self.state: dict[str, str] = {}  # thread -> what it is doing now (diagnosis)
        self.ops = 0
        self.messages = 0
        # one client of the job's store for every virtual member (each client costs a connection, and
        # connections to a TCPStore are slow to open by the dozen), shared without blocking (_PollingStore)
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   wait_for_workers=False, timeout=timeout)
        self._store_lock = threading.Lock()
        self.lazy = os.environ.get("TORCH_GLOO_LAZY_INIT", "0").lower() in ("1", "true")
        self.built = [g for g in plan.order if plan.to_build(g, self.lazy)]
        self._keep: list = []
        self.timed = None  # a timed_replay.TimedReplay: virtual members issue at their calibrated times
        self.issued: dict[int, int] = {}  # timed: comm -> when the virtual members issued it (monotonic ns)

    # timing (a timed slice run): wait for the virtual members' calibrated arrival, say when the op completed
    def _gate(self, comm: int) -> None:
        if self.timed is not None:
            self.timed.gate(comm)
            if comm >= 0:
                self.issued[comm] = time.monotonic_ns()

    def _done(self, comm: int) -> None:
        if self.timed is not None:
            self.timed.complete(comm)

    def issue_table(self) -> pa.Table:
        """When the virtual members issued each real comm (`SLICE_REPLAY`'s columns, host monotonic clock)."""
        comms = sorted(self.issued)
        return pa.table({"comm_id": pa.array(comms, pa.int64()),
                         "t_issue_ns": pa.array([self.issued[c] for c in comms], pa.int64())})

    # building the virtual members
    def _build(self, group: str) -> None:
        members = self.plan.groups[group]
        build = self.plan.to_build(group, self.lazy)
        self.state[f"group {group}"] = f"creating its {len(build)} virtual members " \
                                       f"(waits for the slice ranks to create group {group})"
        made: dict[int, ProcessGroupGloo] = {}
        failed: list[BaseException] = []

        def make(v: int) -> None:
            try:
                shared = _PollingStore(self.store, self._store_lock)
                self._keep.append(shared)  # the Python object must outlive its use from C++
                store = PrefixStore("gloo/", slice_store(group, shared))
                made[v] = ProcessGroupGloo(store, members.index(v), len(members), self.timeout)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        threads = [threading.Thread(target=make, args=(v,), daemon=True) for v in build]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]
        self.pgs[group] = made

    def _load(self, digest: str):
        try:
            return self.payloads.get(digest)
        except shm.CorruptPayload as exc:
            raise ReplayError(str(exc)) from None
        except FileNotFoundError:
            raise ReplayError(f"payload {digest} missing from {self.payloads.dir}") from None

    def _prefetched(self, items: list, load):
        """Yield (item, load(item)) in order, with up to PREFETCH loads running ahead."""
        ahead: deque = deque()
        it = iter(items)

        def fill() -> None:
            while len(ahead) <= PREFETCH:
                item = next(it, _END)
                if item is _END:
                    return
                ahead.append((item, self.loader.submit(load, item)))

        fill()
        while ahead:
            item, fut = ahead.popleft()
            fill()
            yield item, fut.result()

    def _group(self, group: str) -> None:
        """Create the group's virtual members, then replay its collectives in order."""
        name = f"group {group}"
        self._build(group)
        members = self.plan.groups[group]
        n = len(members)
        virtual = self.plan.virtual(group)
        payload = self.plan.payload

        def load(c: Collective):
            mine = {v: self._load(payload[(v, c.key)]) for v in virtual if (v, c.key) in payload}
            root_payload = None
            if c.root >= 0 and c.op in ("broadcast", "scatter"):
                root_rank = members[c.root]  # (a slice rank's capture contribution has the shapes too)
                root_payload = mine.get(root_rank) or self._load(payload[(root_rank, c.key)])
            return mine, root_payload

        # Issued without waiting for the previous one (up to IN_FLIGHT): the real job's ranks issue a burst
        # of async collectives (DDP's buckets) and gloo runs them in order; a member that issued op k+1 only
        # after op k completed made every op of a burst wait for the server's turnaround (the slice then
        # measured transfers 1.75x the truth's on dp8, docs/fidelity.md). A second thread waits for them in
        # order and says when each completed.
        in_flight: deque = deque()
        slots = threading.Semaphore(IN_FLIGHT)
        more = threading.Condition()
        finished = []

        def complete_in_order(_arg) -> None:
            while True:
                with more:
                    while not in_flight and not finished and not self.errors:
                        more.wait(0.5)
                    if self.errors or (finished and not in_flight):
                        return
                    comm, works = in_flight[0]
                for w in works:
                    w.wait()
                self._done(comm)
                with more:
                    in_flight.popleft()
                self.ops += 1
                slots.release()

        waiter = threading.Thread(target=self._run, args=(complete_in_order, None, name), daemon=True,
                                  name=f"prism-replay-g{group}-wait")
        waiter.start()
        for c, (mine, root_payload) in self._prefetched(self.plan.collectives[group], load):
            self.state[name] = f"{c.op} #{c.seq}"
            while not slots.acquire(timeout=0.5):
                if self.errors or not waiter.is_alive():
                    return
            comm = self.timed.collective_comm.get((group, c.seq), -1) if self.timed else -1
            self._gate(comm)
            works = [issue(self.pgs[group][v], c.op, members.index(v), n, c.root, mine.get(v), root_payload)
                     for v in virtual]
            with more:
                in_flight.append((comm, works))
                more.notify_all()
        with more:
            finished.append(True)
            more.notify_all()
        while waiter.is_alive():
            waiter.join(0.5)
        if not self.errors:
            self.state[name] = "done"

    def _channel(self, ch: Channel) -> None:
        name = f"p2p {ch.src}->{ch.dst} group {ch.group} tag {ch.tag}"
        members = self.plan.groups[ch.group]
        while ch.group not in self.pgs:  # its group's virtual members are being created
            if self.errors:
                return
            time.sleep(0.005)
        sending = ch.src not in self.plan.slice_ranks
        pg = self.pgs[ch.group][ch.src if sending else ch.dst]
        for k, (_, (_, ts)) in enumerate(self._prefetched(ch.hashes, self._load)):
            self.state[name] = f"{'send' if sending else 'recv'} #{k}"
            comm = self.timed.message_comm(ch.group, ch.src, ch.dst, ch.tag, k) if self.timed else -1
            self._gate(comm)
            if sending:
                pg.send(list(ts), members.index(ch.dst), ch.tag).wait()
            else:
                pg.recv([torch.empty_like(t) for t in ts], members.index(ch.src), ch.tag).wait()
            self._done(comm)
            self.messages += 1
        self.state[name] = "done"

    def run_to_end(self, threads: list[threading.Thread], t0_ns: int, stop: threading.Event, who: str) -> bool:
        """Start the timed replay's loop (when there is one) beside the replay `threads`, from the common
        start `t0_ns`, and wait for all of them. False, said on stderr (`who` names the process), when one
        of them failed or `stop` was set before everything was replayed."""
        if self.timed is not None:
            loop = threading.Thread(target=self._run, args=(self.timed.run, t0_ns, "timed replay"), daemon=True,
                                    name="prism-timed-replay")
            loop.start()
            threads.append(loop)
        while any(t.is_alive() for t in threads):
            if self.errors:
                break
            if stop.is_set():
                print(f"[prism] {who} stopped before it replayed everything; still waiting for: "
                      + "; ".join(self.pending()), file=sys.stderr, flush=True)
                if self.timed is not None:
                    self.timed.stop()
                return False
            for t in threads:
                t.join(0.05)
                if t.is_alive():
                    break
        if self.errors:
            print(f"[prism] {who} failed: " + "; ".join(self.errors), file=sys.stderr, flush=True)
            return False
        return True

    def _run(self, fn, arg, name: str) -> None:
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.errors.append(f"{name}: {type(exc).__name__}: {exc} (while {self.state.get(name, 'starting')})")

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._run, args=(self._group, g, f"group {g}"), daemon=True,
                                    name=f"prism-replay-g{g}") for g in self.built]
        threads += [threading.Thread(target=self._run, args=(self._channel, ch,
                                                             f"p2p {ch.src}->{ch.dst} group {ch.group} tag {ch.tag}"),
                                     daemon=True, name="prism-replay-p2p") for ch in self.plan.channels]
        for t in threads:
            t.start()
        return threads

    def pending(self) -> list[str]:
        return [f"{who}: {what}" for who, what in sorted(self.state.items()) if what != "done"]


def serve(capture: Path, slice_ranks: list[int], status_dir: Path, timeout_s: float,
          timed: tuple[str, str] | None = None, raw_staging: str | None = None) -> int:
    """The replay server's process: replay, say so (`status_dir/replay.done`), wait for SIGTERM.

    With `timed` = (graph events, calibrated timeline), a timed slice run: the virtual members follow that
    timeline (`timed_replay.TimedReplay`, the clock emulation uses, started with the server) and issue each
    op with a slice rank at their calibrated arrival; `raw_staging/replay/issues.arrow` then says when they
    issued each one. Returns 0 when stopped after replaying everything, 1 on an error or when stopped
    before (printing what it still waited for)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    torch.set_num_threads(1)
    try:
        plan = load_plan(capture, slice_ranks)
    except (ReplayError, OSError, pa.ArrowInvalid) as exc:
        print(f"[prism] replay server: cannot read the capture: {exc}", file=sys.stderr, flush=True)
        return 1
    server = ReplayServer(plan, capture, timedelta(seconds=timeout_s))
    if timed is not None:
        from prism.runtime.replay import clock as timed_replay

        try:
            server.timed = timed_replay.TimedReplay(Path(timed[0]), Path(timed[1]), set(slice_ranks))
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            print(f"[prism] replay server: cannot read the timeline {timed[1]} (or {timed[0]}): {exc}",
                  file=sys.stderr, flush=True)
            return 1
    _alive.append(server)  # the process ends with os._exit: tearing the gloo instances down takes seconds
    started = time.monotonic()
    t0_ns = time.monotonic_ns()  # the common start: the virtual ranks' calibrated clock starts here
    if not server.run_to_end(server.start(), t0_ns, stop, "replay server"):
        return 1
    if server.timed is not None and raw_staging:
        folder = Path(raw_staging) / "replay"
        folder.mkdir(parents=True, exist_ok=True)
        table = server.issue_table()
        with pa.OSFile(str(folder / "issues.arrow.tmp"), "wb") as sink, ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        (folder / "issues.arrow.tmp").replace(folder / "issues.arrow")
    summary = {"groups": len(server.built), "virtual_members": sum(len(plan.to_build(g, server.lazy)) for g in plan.order),
               "collectives": server.ops, "messages": server.messages, "wall_s": time.monotonic() - started,
               "timed": server.timed is not None, "timed_issues": len(server.issued)}
    (status_dir / "replay.done").write_text(json.dumps(summary))
    while not stop.wait(0.1):
        pass
    return 0
