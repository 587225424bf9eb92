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

A group whose collectives are all all-reduces (>= 3 members, CPU; `ring.neighbour_groups`) is not built that
way: its slice ranks run the N-member ring's own steps and the server plays only their ring neighbours, over
one small gloo group (the slice ranks and the server), 2(N-1) messages a run of virtual members instead of
(N-1) x 2(N-1) ring steps (`prism.runtime.slice.ring`; `PRISM_SLICE_RING=members` keeps the instances). The
server tells each group's slice ranks which it is (`decide`) before they create it.

Values: the data comes from the capture, the reductions are gloo's. For groups of two members that equals
the capture bitwise (addition commutes); for larger groups gloo's reduction order differs from prism's
(`semantics`), so results agree within float rounding, as a real gloo run does.

Timed (`--timed-by TIMELINE`, a timed slice run): the virtual ranks follow a calibrated timeline on the clock
emulation uses (`clock.TimedReplay`: their calibrated program order, durations and transfers, from a
common start taken when the server starts); each op with a slice rank is issued once every virtual member
arrived at it on that clock (`gate`) and reported complete when it completed (`complete`), so virtual peers
answer when they would in the real job and the slice ranks wait as they would there. The server then writes
when it issued each of those ops (`raw/replay/issues.arrow`: comm_id, t_issue_ns on the host monotonic
clock): a transfer measured in the slice starts at the last issue of all members, replayed ones included.
Untimed (the default), every op is issued as soon as the group's previous one completed.
Either way the server writes what it played, op by op (`raw/replay/ops.arrow`, `ops_table`: when it could have
issued the virtual members' part -- payloads loaded, a free in-flight slot -- when its first issue call began and
its last returned, when it saw every member's part complete), which the slice stage keeps as
`slices/slice=K/replay_ops.parquet` (`prism.slices.replay_ops`), and its threads' CPU and run-queue wait in
`replay.done` (meta.json's `replay`).

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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from prism import job_paths
from prism.runtime import float8_over_gloo, thread_cpu
from prism.runtime.replay.host import VirtualRanks, keep_until_exit
from prism.runtime.replay.plan import Channel, Collective, ReplayError, ReplayPlan, load_plan
from prism.runtime.slice import ring
from prism.runtime.transport import slice_store


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
    """Issue collective `op` on a virtual member's instance with its recorded contribution; returns the work.
    float8 contributions go as their bytes (`float8_over_gloo`: the slice ranks send theirs so too)."""
    meta, ts = mine if mine is not None else ({}, [])
    ts = float8_over_gloo.as_bytes(ts)
    if root_payload is not None:
        root_payload = (root_payload[0], float8_over_gloo.as_bytes(root_payload[1]))
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


# -- the server ----------------------------------------------------------------------------------------------
class ReplayServer(VirtualRanks):
    """The virtual members of every group with a slice rank, each its own gloo instance (the module doc)."""

    def __init__(self, plan: ReplayPlan, capture: Path, timeout: timedelta) -> None:
        super().__init__(plan, capture, timeout)
        self.lazy = os.environ.get("TORCH_GLOO_LAZY_INIT", "0").lower() in ("1", "true")
        self.rings = ring.neighbour_groups(plan)  # played as the slice ranks' ring neighbours (`ring`)
        self.built = [g for g in plan.order if g in self.rings or plan.to_build(g, self.lazy)]
        self.ring_messages = 0
        self.issued: dict[int, int] = {}  # timed: comm -> when the virtual members issued it (monotonic ns)
        self.played: list[list] = []  # per op played: `SLICE_REPLAY_OPS`' columns but comm_id (`ops_table`)

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

    def _played(self, kind: str, op: str, group: str, seq: int, src: int, dst: int, tag: int, n: int,
                t_ready: int) -> list:
        """A row of `ops_table`, its issue and completion times to be filled in by the caller."""
        row = [kind, op, group, seq, src, dst, tag, n, t_ready, -1, -1, -1]
        self.played.append(row)  # (list.append is atomic under the GIL: the replay threads share it)
        return row

    def ops_table(self) -> pa.Table:
        """What the server played, op by op, on the host monotonic clock (`schemas.SLICE_REPLAY_OPS` without
        comm_id, which the slice stage finds from the slice ranks' events)."""
        names = ("kind", "op", "group_name", "group_seq", "src", "dst", "tag", "virtual_members", "t_ready_ns",
                 "t_issue_ns", "t_issued_ns", "t_complete_ns")
        rows = sorted(self.played, key=lambda r: (r[0], r[2], r[4], r[5], r[6], r[3]))  # not the threads' order
        cols = list(zip(*rows)) if rows else [()] * len(names)
        return pa.table({n: pa.array(list(c), pa.string() if i < 3 else pa.int32() if i in (4, 5, 7) else pa.int64())
                         for i, (n, c) in enumerate(zip(names, cols))})

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
                store = PrefixStore("gloo/", slice_store(group, self.shared_store()))
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

    def decide(self) -> None:
        """Tell every group's slice ranks how the group is played (`ring.decision`), before they create it."""
        store = self.shared_store()
        for g in self.plan.order:
            slice_store(g, store).set(ring.DECISION_KEY, "neighbours" if g in self.rings else "members")

    def _ring_group(self, group: str) -> None:
        """A neighbours group: the server's end of its ring group, then each all-reduce's runs, in order."""
        name = f"group {group}"
        members = self.plan.groups[group]
        n = len(members)
        live = ring.live_positions(members, self.plan.slice_ranks)
        self.state[name] = f"creating its ring group (waits for its {len(live)} slice ranks)"
        pg = ring.ring_group(slice_store(group, self.shared_store()), len(live), len(live) + 1, self.timeout)
        self.pgs[group] = {}
        payload = self.plan.payload
        template_rank = members[live[0]]

        def load(c: Collective):
            meta, ts = self._load(payload[(template_rank, c.key)])
            if len(ts) != 1:
                raise ReplayError(f"group {group}: {c.op} #{c.seq} has {len(ts)} tensors a member; the neighbours "
                                  "ring carries one (set PRISM_SLICE_RING=members)")
            contributions = None
            if ring.exact(ts[0].dtype):  # the ring must compute it: every member's recorded contribution
                contributions = {p: self._load(payload[(r, c.key)])[1][0] for p, r in enumerate(members)}
            return meta, ts[0], contributions

        # in issue order, as many at once as the slice ranks' side (and a real gloo group) runs: `ring.GLOO_THREADS`
        slots = threading.Semaphore(ring.GLOO_THREADS)
        lock = threading.Lock()

        def played(tag: int, meta, template, contributions, row: list, comm: int) -> None:
            try:
                sent = ring.play(pg, n, live, tag, template, _red(meta), contributions)
                row[11] = time.monotonic_ns()
                self._done(comm)
                with lock:
                    self.ring_messages += sent
                    self.ops += 1
            finally:
                slots.release()

        with ThreadPoolExecutor(ring.GLOO_THREADS, thread_name_prefix=f"prism-ring-server-g{group}") as pool:
            running = []
            for tag, (c, (meta, template, contributions)) in enumerate(
                    self._prefetched(self.plan.collectives[group], load)):
                slots.acquire()
                self.state[name] = f"{c.op} #{c.seq} (ring)"
                row = self._played("collective", c.op, group, c.seq, -1, -1, -1, n - len(live), time.monotonic_ns())
                comm = self.timed.collective_comm.get((group, c.seq), -1) if self.timed else -1
                self._gate(comm)
                row[9] = row[10] = time.monotonic_ns()
                running.append(pool.submit(played, tag, meta, template, contributions, row, comm))
                done = [f for f in running if f.done()]
                for f in done:
                    f.result()  # (raises a ring's error here)
                running = [f for f in running if f not in done]
            for f in running:
                f.result()
        self.state[name] = "done"

    def _group(self, group: str) -> None:
        """Create the group's virtual members, then replay its collectives in order."""
        if group in self.rings:
            return self._ring_group(group)
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

        # Issued without waiting for the previous one: the real job's ranks issue a burst of async collectives
        # (DDP's buckets) and gloo runs them in order; a member that issued op k+1 only after op k completed
        # made every op of a burst wait for the server's turnaround (the slice then measured transfers 1.75x the
        # truth's on dp8, docs/fidelity.md). At most as many in flight as a real member had in the capture
        # (`plan.in_flight`): a real member issues op k only once op k - in_flight completed, and so does the
        # server, so it never holds back an op the job's ranks would have issued (a fixed 8 held back 4 of
        # dp8-var's 12 EDP ops an iteration, session 12). A second thread waits for them in order and says
        # when each completed.
        in_flight: deque = deque()
        slots = threading.Semaphore(self.plan.in_flight[group])
        more = threading.Condition()
        finished = []

        def complete_in_order(_arg) -> None:
            while True:
                with more:
                    while not in_flight and not finished and not self.errors:
                        more.wait(0.5)
                    if self.errors or (finished and not in_flight):
                        return
                    comm, works, row = in_flight[0]
                for w in works:
                    w.wait()
                row[11] = time.monotonic_ns()
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
            row = self._played("collective", c.op, group, c.seq, -1, -1, -1, len(virtual), time.monotonic_ns())
            comm = self.timed.collective_comm.get((group, c.seq), -1) if self.timed else -1
            self._gate(comm)
            row[9] = time.monotonic_ns()
            works = [issue(self.pgs[group][v], c.op, members.index(v), n, c.root, mine.get(v), root_payload)
                     for v in virtual]
            row[10] = time.monotonic_ns()
            with more:
                in_flight.append((comm, works, row))
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
        if not self.wait_for_group(ch.group):  # its group's virtual members are being created
            return
        sending = ch.src not in self.plan.slice_ranks
        pg = self.pgs[ch.group][ch.src if sending else ch.dst]
        for k, (_, (_, ts)) in enumerate(self._prefetched(ch.hashes, self._load)):
            ts = float8_over_gloo.as_bytes(ts)  # (gloo moves no float8)
            self.state[name] = f"{'send' if sending else 'recv'} #{k}"
            row = self._played("send" if sending else "recv", "send" if sending else "recv", ch.group, k, ch.src,
                               ch.dst, ch.tag, 1, time.monotonic_ns())
            comm = self.timed.message_comm(ch.group, ch.src, ch.dst, ch.tag, k) if self.timed else -1
            self._gate(comm)
            row[9] = time.monotonic_ns()
            if sending:
                work = pg.send(list(ts), members.index(ch.dst), ch.tag)
            else:
                work = pg.recv([torch.empty_like(t) for t in ts], members.index(ch.src), ch.tag)
            row[10] = time.monotonic_ns()
            work.wait()
            row[11] = time.monotonic_ns()
            self._done(comm)
            self.messages += 1
        self.state[name] = "done"


def serve_spec(spec) -> int:
    """The replay process of mode slice (`modes`), from the zygote's spec: `serve`."""
    return serve(Path(spec.capture), spec.ranks, Path(spec.status_dir), float(spec.replay_timeout_s or 600),
                 spec.timed, spec.raw_staging)


def serve(capture: Path, slice_ranks: list[int], status_dir: Path, timeout_s: float,
          timed: tuple[str, str] | None = None, raw_staging: str | None = None) -> int:
    """The replay server's process: replay, say so (`status_dir/replay.done`), wait for SIGTERM.

    With `timed` = (graph events, calibrated timeline), a timed slice run: the virtual members follow that
    timeline (`clock.TimedReplay`, the clock emulation uses, started with the server) and issue each
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
    try:
        server = ReplayServer(plan, capture, timedelta(seconds=timeout_s))
    except ring.RingError as exc:
        print(f"[prism] replay server: {exc}", file=sys.stderr, flush=True)
        return 1
    if timed is not None:
        from prism.runtime.replay import clock

        try:
            server.timed = clock.TimedReplay(Path(timed[0]), Path(timed[1]), set(slice_ranks))
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            print(f"[prism] replay server: cannot read the timeline {timed[1]} (or {timed[0]}): {exc}",
                  file=sys.stderr, flush=True)
            return 1
    keep_until_exit(server)  # the process ends with os._exit: tearing the gloo instances down takes seconds
    server.decide()
    started = time.monotonic()
    t0_ns = time.monotonic_ns()  # the common start: the virtual ranks' calibrated clock starts here
    if not server.run_to_end(server.start(), t0_ns, stop, "replay server"):
        return 1
    if raw_staging:
        folder = Path(raw_staging) / "replay"
        folder.mkdir(parents=True, exist_ok=True)
        tables = {"ops": server.ops_table()}
        if server.timed is not None:
            tables["issues"] = server.issue_table()
        for name, table in tables.items():
            with pa.OSFile(str(folder / f"{name}.arrow.tmp"), "wb") as sink, ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            (folder / f"{name}.arrow.tmp").replace(job_paths.stream_file(folder, name))
    summary = {"groups": len(server.built),
               "virtual_members": sum(len(plan.to_build(g, server.lazy)) for g in plan.order if g not in server.rings),
               "ring_groups": sorted(server.rings), "ring_messages": server.ring_messages,
               "collectives": server.ops, "messages": server.messages, "wall_s": time.monotonic() - started,
               "timed": server.timed is not None, "timed_issues": len(server.issued),
               "in_flight": {g: plan.in_flight[g] for g in server.built},  # per group, from the capture
               # what the server's own CPU cost and where (issue 24 (b): beside the slice ranks' cores or not)
               "cpu_s": sum(os.times()[:2]), "threads_cpu_s": thread_cpu.by_thread(),
               "threads_runq_wait_s": thread_cpu.runq_wait_by_thread(),
               "cores": sorted(os.sched_getaffinity(0))}
    (status_dir / "replay.done").write_text(json.dumps(summary))
    while not stop.wait(0.1):
        pass
    return 0
