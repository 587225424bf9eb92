"""Capture mode, rank side: the transport that moves data through shared memory under the coordinator.

`CaptureTransport` implements the ops of one process group (collectives, point to point) on this rank's
link to the coordinator (`capture.client`): issuing an op writes this rank's contribution and announces its
arrival; completing it computes this rank's outputs from the members' contributions (`semantics`). Sends are
buffered: a send completes once its data is written.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism.runtime import semantics
from prism.runtime.capture.client import CaptureClient, CaptureWork, GroupCount, client


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

    def __init__(self, group_name: str, group_rank: int, members: list[int], desc: str | None) -> None:
        self.group = group_name
        self.me = group_rank
        self.members = tuple(members)
        self.n = len(members)
        self.desc = desc
        self.seq = 0
        self._c = None
        self._sent = self._received = self._received_any = None
        GroupCount.created += 1

    @property
    def c(self) -> CaptureClient:
        if self._c is None:  # first use: now the coordinator needs the group's description
            self._c = client()
            self._c.send(("group", self.group, self.desc, self.members))
            GroupCount.linked += 1
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


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> CaptureTransport:
    """Mode capture (`modes`): the group's ops go through the coordinator."""
    return CaptureTransport(name, opts.group_rank, members, desc)
