"""Capture mode, rank side: the transport that moves data through shared memory under the coordinator.

`CaptureTransport` implements the ops of one process group (collectives, point to point) on this rank's
link to the coordinator (`capture.client`): issuing an op writes this rank's contribution and announces its
arrival; completing it computes this rank's outputs from the members' contributions (the completions are
`contributions.ContributionTransport`'s, the values `semantics`'). Sends are buffered: a send completes once its data is written.
"""

from __future__ import annotations

import torch

from prism.runtime import semantics, shm
from prism.runtime.contributions import ContributionTransport
from prism.runtime.capture.client import SHARED, CaptureClient, CaptureWork, Contributions, GroupCount, client


def _shapes(result) -> list:
    """Shapes (nested like the op's outputs) of a result: what a replay must allocate."""
    if isinstance(result, torch.Tensor):
        return tuple(result.shape)
    return [_shapes(r) for r in result]


class CaptureTransport(ContributionTransport):
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
            reads = range(self.n)
        needs = None if reads is None else Contributions(self.c, key, reads)
        return CaptureWork(self.c, [key], lambda: complete(key), result, needs)

    def _keep(self, key: tuple, outputs, work_id: int) -> None:
        """A reduction's result, kept for slice runs where its value depends on the order (> 2 members)."""
        if self.n > 2:
            self.c.keep_result(key, list(outputs), work_id)

    def _reduced(self, key: tuple, red) -> list[torch.Tensor]:
        """An all-reduce's value, folded once a collective: the first member to complete it folds the N
        contributions (in group order, as every member would) and leaves the value in the key's shared file;
        the other members read that one file instead of folding N each (a DP all-reduce of 2,048 members:
        2,048 reads a member, ~4.2 M a collective, before). The value is the same to the bit either way."""
        try:
            return self.c.read(key, SHARED)[1]
        except FileNotFoundError:
            pass
        value = self._fold(key, red, lambda ts: ts)
        shm.write(self.c.file(key, SHARED), shm.encode(value))
        return value

    def _inputs(self, key: tuple, members=None):
        """The members' contributions, read one at a time (group order): a rank holds one member's bytes
        at once, not the group's (its memory stays flat in the group size, hence in W)."""
        for i in (range(self.n) if members is None else members):
            yield self._contribution(key, i)

    def _contribution(self, key: tuple, member: int):
        return self.c.read(key, f"-r{member}")

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
                semantics.write(t, src_t)

        return CaptureWork(self.c, [key], lambda: complete(key), list(tensors), [self.c.file(key, "")])

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
                semantics.write(t_, src_t)
            src = meta["src"]
            peer = self.members[src]
            self.received[(peer, tag)] = self.received.get((peer, tag), 0) + 1  # it consumed that message
            work.source = src

        work = CaptureWork(self.c, [key], complete, list(tensors), [self.c.file(key, "")])
        return work


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> CaptureTransport:
    """Mode capture (`modes`): the group's ops go through the coordinator."""
    return CaptureTransport(name, opts.group_rank, members, desc)
