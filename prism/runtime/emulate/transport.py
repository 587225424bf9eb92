"""Mode `emulate`: the sandbox ranks run the real program inside a W-rank job whose other ranks are replayed.

Rank side (`EmulateTransport`, one per group the sandbox rank belongs to). A group's collectives run among
its *participants*: each sandbox member, and one compensator per maximal run of consecutive virtual members
(`compensation.pruned_members`; with `--no-pruning` every virtual member is its own participant). Only
groups holding a sandbox rank exist as communicators (the sandbox rank creates only its own groups; the
worker only groups with a sandbox rank and a virtual one): one gloo instance per participant over the key
space `prism-emu/<group>/` of the job's store. Groups of sandbox members alone compute among themselves:
their collectives are native gloo ops of that instance (`native_group`; reductions keep prism's left
fold), the kinds it does not cover run the protocol below.

A collective runs the pruned protocol (`prism.runtime.emulate.pruned`, its one definition): `pruned.Protocol` plans
the messages between participants, `pruned.run` is one participant's part, over its gloo instance
(`GlooWire`). A sandbox member contributes its *live* tensors, a compensator the *recorded* tensors of its
run's members (from the capture's payloads). Reductions fold in a chain in group order (`compensation`'s
`prefold`/`fold_from`/`finish`), so a sandbox member's result is bitwise what `semantics` defines over its
live values and the virtual ranks' recorded ones — not the capture's result (which slice mode
substitutes); data movement sends each sandbox member only what it reads. Completion then writes the
outputs (`ContributionTransport`'s completion functions where the outcome is the members' contributions).
The protocol runs on one thread per group (issue order = group order, as on a real backend), so async ops
stay async. A collective run by the protocol completes no earlier than the member's arrival (its call) +
the op's calibrated transfer, nor than the virtual floor the worker sends (`floor_sender`), nor than the
group's other sandbox members' last arrival + the transfer (each sandbox participant sends the others its
arrival, `ARRIVAL_TAG`), when the job is calibrated (the transfer hold: `replay.clock`'s module doc;
`transfer_hold_s`); the hold is the work's
(`emulate.works`), never the group thread's, so a group's next collective is exchanged while the previous
one is held. A native op of an all-sandbox group is not held: it is the job's own op (`_native`).
Point-to-point messages go straight over the participants' gloo pair, with a tag that names
(tag, sender, receiver). In a timed emulation a send completes for the program at once, as the model has it
(`prism.clock_rule`), its data going out on a sender thread (`works.SendQueue`): a gloo send completes only once
the receiver posted its recv. `bytes_sent` counts the tensor bytes of every message (the protocol's bytes);
`framing_bytes` the messages' headers apart.

Worker side (`serve`): one process for every virtual rank, forked by the zygote. It reads the capture's
plan (`replay.plan.load_plan`: groups, collectives in group order, payload index, messages), creates the
compensators of every group with a sandbox member, and replays: per group one thread issues each
collective for all its compensators; per message channel (sandbox <-> virtual) one thread sends recorded
payloads / receives. Payloads are loaded ahead through `prefetch.PayloadPool` (`--prefetch-mb`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from prism import job_paths, settings
from prism.runtime.emulate import compensation as comp
from prism.runtime.emulate.common_start import to_local_clock
from prism.runtime import ops, semantics, shm, watchdog
from prism.runtime.emulate import calibrated, native_group
from prism.runtime.emulate import pruned
from prism.runtime.backend import flat_tensors
from prism.runtime.emulate.works import HOPS, SENDS, STATS, STATS_LOCK, EmuWork, NativeWork, SourceWork, stream_order
from prism.runtime.contributions import ContributionTransport
from prism.runtime.transport import job_store

EMU_PREFIX = "prism-emu"
TRANSFERS_KEY, OWNS_KEY = calibrated.TRANSFERS_KEY, calibrated.OWNS_KEY
transfers, wait_owns, timed = calibrated.transfers, calibrated.wait_owns, calibrated.timed


def floor_sender(parts: list[tuple[int, list[int]]], sandbox: set[int]) -> int | None:
    """The participant that sends a group's sandbox participants each collective's virtual floor: the
    first compensator (None: the group has none). The floor is the host monotonic time at which the
    calibrated model completes the collective for the virtual members' arrivals (t0 + their last arrival
    + its transfer, `TimedReplay.gate`); a sandbox member's collective completes no earlier (with its
    own arrival + the transfer: the transfer hold)."""
    return next((i for i, p in enumerate(parts) if not comp.is_sandbox(p, sandbox)), None)


class EmulationError(RuntimeError):
    """The sandbox asked for something emulation does not do (the message names it)."""


def sandbox_ranks() -> set[int]:
    return set(settings.SLICE_RANKS.get())


def pruning() -> bool:
    return settings.PRUNING.get()


participants, contribution = pruned.participants, pruned.contribution


def emu_store(group: str, base):
    """Group `group`'s key space on the job's store (the same in the sandbox ranks and the worker)."""
    return PrefixStore(f"{EMU_PREFIX}/{group}/", job_store(base))


def p2p_tag(tag: int, n: int, src: int, dst: int) -> int:
    """The gloo tag of a message of the program's `tag` from group rank `src` to `dst`: a compensator hosts
    several members, so its pair channel must tell them apart."""
    return (tag * n + src) * n + dst


# -- the blob a participant contributes ---------------------------------------------------------------------
def encode_parts(parts: list[tuple[int, dict, list[torch.Tensor]]]) -> bytes:
    """Contributions of some members: [(group rank, meta, tensors)] as one buffer."""
    flat = [t for _, _, ts in parts for t in ts]
    return shm.encode(flat, {"parts": [(i, meta, len(ts)) for i, meta, ts in parts]})


def decode_parts(data: bytes) -> dict[int, tuple[dict, list[torch.Tensor]]]:
    meta, flat = shm.decode(data)
    out, k = {}, 0
    for i, m, count in meta["parts"]:
        out[i] = (m, flat[k:k + count])
        k += count
    return out


COLL_TAG = 1 << 30  # gloo tags of the collectives' messages (p2p tags stay far below: p2p_tag)
FLOOR_TAG = COLL_TAG - 1  # a collective's virtual floor (int64 ns), from `floor_sender` to each sandbox participant
ARRIVAL_TAG = COLL_TAG - 2  # a sandbox participant's arrival at a collective (int64 ns, host 0's clock), to the others


class GlooWire:
    """`pruned.run`'s wire over one participant's gloo instance: a message of parts is its size, then its
    blob (`encode_parts`); a reduction's tensors go bare; sends are asynchronous until `flush`. Counts the tensor bytes it sends (`bytes`, what
    the protocol's plan moves) and the blobs' framing apart."""

    def __init__(self, pg: ProcessGroupGloo | None) -> None:
        self.pg = pg
        self.works, self.keep = [], []
        self.bytes = self.framing = self.sends = 0

    def send(self, dst: int, parts) -> None:
        blob = encode_parts(parts)
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        size = torch.tensor([len(blob)], dtype=torch.int64)
        self.keep += [data, size]
        self.works += [self.pg.send([size], dst, COLL_TAG), self.pg.send([data], dst, COLL_TAG + 1)]
        payload = sum(pruned.nbytes(ts) for _, _, ts in parts)
        self.bytes += payload
        self.framing += len(blob) - payload
        self.sends += 1

    def send_tensors(self, dst: int, tensors) -> None:
        """A reduction's tensors, one gloo message each (the receiver knows their shapes): no header."""
        for j, t in enumerate(tensors):
            if not t.numel():  # nothing to send (the receiver knows it is empty)
                continue
            data = t.detach().contiguous().cpu()
            self.keep.append(data)
            self.works.append(self.pg.send([data], dst, COLL_TAG + 2 + j))
            self.bytes += data.numel() * data.element_size()
        self.sends += 1

    def recv_tensors(self, src: int, like) -> list[torch.Tensor]:
        bufs = [torch.empty(t.shape, dtype=t.dtype) for t in like]
        for w in [self.pg.recv([b], src, COLL_TAG + 2 + j) for j, b in enumerate(bufs) if b.numel()]:
            w.wait()
        return bufs

    def recv(self, src: int) -> dict:
        size = torch.empty(1, dtype=torch.int64)
        self.pg.recv([size], src, COLL_TAG).wait()
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        self.pg.recv([buf], src, COLL_TAG + 1).wait()
        return decode_parts(bytearray(buf.numpy()))

    def recv_tensors_many(self, srcs: list[int], likes: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """`recv_tensors` from each of `srcs`, every receive posted before the first wait."""
        bufs = [[torch.empty(t.shape, dtype=t.dtype) for t in like] for like in likes]
        works = [self.pg.recv([b], src, COLL_TAG + 2 + j) for src, bs in zip(srcs, bufs)
                 for j, b in enumerate(bs) if b.numel()]
        for w in works:
            w.wait()
        return bufs

    def recv_many(self, srcs: list[int]) -> list[dict]:
        """`recv` from each of `srcs`, the receives posted together (sizes, then blobs): two waits in all,
        not two per sender."""
        sizes = [torch.empty(1, dtype=torch.int64) for _ in srcs]
        for w in [self.pg.recv([size], src, COLL_TAG) for size, src in zip(sizes, srcs)]:
            w.wait()
        bufs = [torch.empty(int(size.item()), dtype=torch.uint8) for size in sizes]
        for w in [self.pg.recv([buf], src, COLL_TAG + 1) for buf, src in zip(bufs, srcs)]:
            w.wait()
        return [decode_parts(bytearray(buf.numpy())) for buf in bufs]

    def flush(self) -> None:
        """Wait for the sends; add what was sent to this process's numbers."""
        for w in self.works:
            w.wait()
        with STATS_LOCK:  # the worker's group threads share the numbers
            STATS["bytes_sent"] += self.bytes
            STATS["framing_bytes"] += self.framing
            STATS["collective_messages"] += self.sends
        self.works, self.keep = [], []
        self.bytes = self.framing = self.sends = 0


# -- rank side ---------------------------------------------------------------------------------------------
class EmulateTransport(ContributionTransport):
    """The transport of one group of a sandbox rank (see the module doc)."""

    def __init__(self, store, group_name: str, group_rank: int, members: list[int],
                 timeout: timedelta | None) -> None:
        self.group = group_name
        self.me = group_rank
        self.members = tuple(members)
        self.n = len(members)
        self.seq = 0
        self.received_any: dict[int, int] = {}  # recvs from any source, by tag
        STATS["groups"] += 1
        self.parts = participants(self.members, sandbox_ranks(), pruning())
        self.host = {m: i for i, (_, run) in enumerate(self.parts) for m in run}  # member -> participant
        self.index = self.host[self.members[self.me]]
        self._root = -1
        self.pg = None
        if len(self.parts) > 1:
            self.pg = ProcessGroupGloo(PrefixStore("gloo/", emu_store(group_name, store)), self.index,
                                       len(self.parts), timeout or timedelta(minutes=30))
            STATS["communicators"] += 1
        self.native = self.pg is not None and native_group.all_sandbox(self.parts, sandbox_ranks())
        self.floor_src = floor_sender(self.parts, sandbox_ranks())
        # the group's other sandbox participants: each protocol collective's arrivals are exchanged with them
        self.peers = [i for i, p in enumerate(self.parts) if i != self.index and comp.is_sandbox(p, sandbox_ranks())]
        self.got: dict[tuple, dict] = {}
        self.store = store
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"prism-emu-g{group_name}")

    def _keep(self, key, outputs, work_id) -> None:  # nothing is kept: the values are this run's
        pass

    def _inputs(self, key: tuple, members=None):
        got = self.got[key]
        return [got[i] for i in (range(self.n) if members is None else members)]

    def _contribution(self, key: tuple, member: int):
        return self.got[key][member]

    def call(self, method: str, device, *args, work_id: int = -1, op: str = ""):
        if self.native:
            issued = native_group.issue(self.pg, self.n, self.me, method, args)
            if issued is not None:
                return self._native(issued, _native_result(method, args))
        opts = args[-1] if args else None
        self._root = getattr(opts, "rootRank", -1) if method in ops.ROOTED else -1
        return super().call(method, device, *args, work_id=work_id, op=op)

    def _collective(self, op: str, work_id: int, mine, complete, result, meta=None, info_tensors=None,
                    reads="all"):
        """Run this member's part of the pruned protocol (`pruned.run`) on the group's thread; `complete`
        then reads the outcome: `self.got[key]` (reductions: {"result": ...}; else the contributions,
        slices or pieces received, by group position, which `_inputs` / `c.read` return)."""
        arrival = time.monotonic_ns()
        key = ("c", self.group, self.seq)
        floor = self._own_floor(arrival)
        own_ns = wait_owns(self.store).get(f"{self.group}/{self.seq}", 0)  # this rank's lag (the model's)
        floor_src = self.floor_src if timed(self.store) else None
        self.seq += 1
        proto = pruned.Protocol(op, self.members, sandbox_ranks(), self.parts, self._root)
        red = getattr(semantics.RedOp, meta["reduce_op"]) if meta and "reduce_op" in meta else None
        own = {} if mine is None else {self.me: (dict(meta or {}, op=op), contribution(mine))}
        order = stream_order(list(mine or []) + flat_tensors(result))
        work = EmuWork(result, own_ns)

        peers = self.peers if timed(self.store) else []

        def exchange() -> tuple[int, int, torch.Tensor, int]:
            wire = GlooWire(self.pg)
            virtual = torch.zeros(1, dtype=torch.int64)
            got_floor = None if floor_src is None else self.pg.recv([virtual], floor_src, FLOOR_TAG)
            # the other sandbox members' arrivals: the model completes the op a transfer after the last
            # arrival of any member, and the floor the worker sends knows only the virtual ones
            stamp = torch.tensor([arrival - settings.CLOCK_OFFSET_NS.get()], dtype=torch.int64)
            theirs = [torch.zeros(1, dtype=torch.int64) for _ in peers]
            stamps = [self.pg.send([stamp], i, ARRIVAL_TAG) for i in peers]
            stamps += [self.pg.recv([t], i, ARRIVAL_TAG) for t, i in zip(theirs, peers)]
            outcome = pruned.run(proto, self.index, own, wire, red)
            wire.flush()
            data = time.monotonic_ns()
            if got_floor is not None:
                got_floor.wait()
            for w in stamps:
                w.wait()
            last = max((to_local_clock(int(t[0])) for t in theirs), default=0)
            told = time.monotonic_ns()
            self.got[key] = (outcome or {}).get("got", outcome)
            with torch.no_grad():
                complete(key)
            del self.got[key]
            return data, told, virtual, last

        def run() -> None:  # the exchange; the hold is the work's (`emulate.works`), never this thread's
            began = time.monotonic_ns()
            try:
                if order is None:
                    data, told, virtual, last = exchange()
                else:  # CUDA tensors: ordered after the caller's stream, outputs written before completion
                    with order.device():
                        order.inputs_ready()
                        data, told, virtual, last = exchange()
                        order.outputs_written()
                STATS["collectives"] += 1
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                work.fail(exc)
                return
            # the worker's floor (host 0's clock) on ours, and the last other sandbox member's arrival + the transfer
            at = max(floor, to_local_clock(int(virtual[0])), last + (floor - arrival) if last else 0)
            with STATS_LOCK:  # past the floor: the data, then the floor message (0 when on time)
                HOPS["data_past_floor_s"] += max(0, data - at) / 1e9
                HOPS["floor_msg_past_floor_s"] += max(0, told - max(at, data)) / 1e9
                per = HOPS["by_op"].setdefault(f"{op} group {self.group}", [0, 0.0, 0.0, 0.0])
                per[0] += 1
                per[1] += (began - arrival) / 1e9
                per[2] += (data - began) / 1e9
                per[3] += max(0, data - at) / 1e9
            work.finish(at, arrival, began)

        self._thread.submit(run)
        return work

    def _own_floor(self, arrival: int) -> int:
        """The transfer hold from this member's own arrival at the group's next collective run by the
        protocol: its arrival + the calibrated transfer (the protocol is prism's stand-in for the job's op:
        pruned, or a chain where the job runs gloo's own reduction)."""
        return arrival + transfers(self.store).get(f"{self.group}/{self.seq}", 0)

    def _native(self, issued: native_group.Issued, result) -> "NativeWork":
        """A collective of an all-sandbox group, started as a native gloo op (`native_group`): completes
        when its works do. It is not held to the calibrated transfer: it is the job's own op among the
        job's own ranks, and holding it made each op last the longer of two noisy times, the slice run's
        and this one's (dp8-ep4's 40 all-to-alls: +29 ms an iteration held, +7 not; device-10b in
        `docs/fidelity.md`)."""
        works, finish, sent = issued
        self.seq += 1
        with STATS_LOCK:
            STATS["bytes_sent"] += sent
        return NativeWork(works, finish, 0, result)

    # -- the kinds whose outcome is not every member's contribution ---------------------------------------
    def _result(self, key: tuple) -> list[torch.Tensor]:
        return self.got[key]["result"]

    def _allreduce(self, work_id, op, tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            for t, r in zip(tensors, self._result(key)):
                semantics.write(t, r)

        return self._collective(op, work_id, list(tensors), complete, list(tensors), meta={"reduce_op": red.name})

    _allreduce_coalesced = _allreduce

    def _reduce(self, work_id, op, tensors, opts):
        red, root = semantics.red_op(opts), opts.rootRank

        def complete(key):
            if self.me == root:
                for t, r in zip(tensors, self._result(key)):
                    semantics.write(t, r)

        return self._collective(op, work_id, list(tensors), complete, list(tensors),
                                meta={"reduce_op": red.name, "root": root})

    def _reduce_scatter(self, work_id, op, output_tensors, input_tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            for out, r in zip(output_tensors, self._result(key)):
                semantics.write(out, r.view_as(out))

        flat = [t for lst in input_tensors for t in lst]
        return self._collective(op, work_id, flat, complete, output_tensors, meta={"reduce_op": red.name})

    def _reduce_scatter_single(self, work_id, op, output, input, opts):
        red = semantics.red_op(opts)

        def complete(key):
            semantics.write(output, self._result(key)[0].view_as(output))

        return self._collective(op, work_id, [input], complete, [output], meta={"reduce_op": red.name})

    def _alltoall_base(self, work_id, op, output, input, output_split_sizes, input_split_sizes, opts):
        def complete(key):
            got = self.got[key]
            # joined in host memory, then one copy into the output: nothing allocated on a CUDA sandbox's device
            semantics.write(output, torch.cat([got[i][1][0].cpu() for i in range(self.n)]).view_as(output))

        return self._collective(op, work_id, [input], complete, [output],
                                meta={"splits": list(input_split_sizes),
                                      "out_splits": list(output_split_sizes) or [output.shape[0] // self.n] * self.n})

    def _alltoall(self, work_id, op, output_tensors, input_tensors, opts):
        def complete(key):
            got = self.got[key]
            for k, out in enumerate(output_tensors):
                semantics.write(out, got[k][1][0])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors)

    def _scatter(self, work_id, op, output_tensors, input_tensors, opts):
        root = opts.rootRank

        def complete(key):
            semantics.write(output_tensors[0], self.got[key][root][1][0])

        mine = list(input_tensors[0]) if self.me == root else None
        return self._collective(op, work_id, mine, complete, output_tensors)

    # -- point to point: straight over the participants' pair --------------------------------------------
    def _send(self, work_id, op, tensors, dst, tag):
        if self.pg is None:
            raise EmulationError(f"send within group {self.group} of one participant")
        STATS["bytes_sent"] += sum(t.numel() * t.element_size() for t in tensors)
        STATS["messages"] += 1
        to, gloo_tag = self.host[self.members[dst]], p2p_tag(tag, self.n, self.me, dst)
        if timed(self.store) and all(t.device.type == "cpu" for t in tensors):
            # the model's send completes locally; gloo's waits for the receiver's recv (`works.SendQueue`)
            return SENDS.send(self.pg, list(tensors), to, gloo_tag)
        return self.pg.send(list(tensors), to, gloo_tag)

    def _recv(self, work_id, op, tensors, src, tag):
        if self.pg is None:
            raise EmulationError(f"recv within group {self.group} of one participant")
        STATS["bytes_received"] += sum(t.numel() * t.element_size() for t in tensors)
        STATS["messages"] += 1
        return self.pg.recv(list(tensors), self.host[self.members[src]], p2p_tag(tag, self.n, src, self.me))

    def _recv_anysource(self, work_id, op, tensors, tag):
        """A recv from any source takes its message from the sender the capture paired it with (the k-th
        such recv of this group and tag on this rank received from the k-th recorded peer): the emulated
        job's arrival order is the graph's, as the virtual senders replay it."""
        k = self.received_any.get(tag, 0)
        self.received_any[tag] = k + 1
        rank = self.members[self.me]
        peers = anysource_peers(rank).get((self.group, tag), [])
        if k >= len(peers):
            raise EmulationError(f"rank {rank}: recv from any source #{k} of group {self.group} tag {tag} has no "
                                 f"counterpart in the capture ({len(peers)} there): the sandbox departs from its "
                                 "capture; capture again with the same program")
        src = self.members.index(peers[k])
        return SourceWork(self._recv(work_id, op, tensors, src, tag), src)


def _native_result(method: str, args: tuple):
    """What a native collective's work answers as its result (the outputs, as `ContributionTransport` gives)."""
    if method == "broadcast":
        return list(args[0])
    if method == "barrier":
        return []
    if method == "allgather":
        return args[0]
    return [args[0]]  # alltoall_base, all_gather_single, reduce_scatter_single: the output


_ANYSOURCE: dict[int, dict] = {}


def anysource_peers(rank: int) -> dict[tuple[str, int], list[int]]:
    """The senders (global ranks) the capture recorded for `rank`'s recvs from any source, in program
    order, by (group, tag)."""
    if rank not in _ANYSOURCE:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401  (pa.ipc)

        from prism import schemas

        path = job_paths.rank_stream(settings.CAPTURE.get(), rank)
        with pa.OSFile(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
        cols = [table[c].cast(pa.string()) if pa.types.is_dictionary(table[c].type) else table[c]
                for c in ("kind", "op", "group_name", "tag", "peer", "seq")]
        found: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for kind, op, group, tag, peer, seq in zip(*(c.to_pylist() for c in cols)):
            if kind == schemas.KIND_RECV and op == schemas.OP_RECV_ANYSOURCE:
                found.setdefault((group, tag), []).append((seq, peer))
        _ANYSOURCE[rank] = {key: [p for _, p in sorted(v)] for key, v in found.items()}
    return _ANYSOURCE[rank]


_T0_NS: list[int] = []  # the common start, once met


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> EmulateTransport:
    """Mode emulate (`modes`): at the rank's first group, meet the other sandbox ranks and the replay worker
    (the rank's timeline starts at their common t0, `replay.clock.common_start`); then the group's transport."""
    if not _T0_NS:
        from prism.runtime.emulate.common_start import common_start
        from prism.runtime.emulate.fold_cuda import build_before_run

        build_before_run()  # before the clocks and the watchdog start (fold_cuda says why)

        _T0_NS.append(common_start(job_store(opts.store), len(sandbox_ranks()) + 1))
        if rec is not None:
            rec.resync(_T0_NS[0])
    # the sandbox ranks and the replay worker watch each other (`watchdog`: the real-mode rule)
    watchdog.start(job_store(opts.store), int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   ranks=sorted(sandbox_ranks()), replayed=True)
    return EmulateTransport(opts.store, name, opts.group_rank, members, opts.timeout)
