"""The pruned collective protocol, defined once: its plan of messages and what each participant does.

A group has `members` in group (ring) order; `sandbox` members contribute live tensors, every other member
(virtual) its recorded one. A collective runs among *participants* (`compensation.pruned_members`: each
sandbox member and one compensator per run of consecutive virtual members; without pruning every member
is its own participant). `Protocol.links` is the plan: the messages ``(src, dst, what)`` between
participants, in causal order. `run` is one participant's part: it walks the plan, sends what it must
and receives what is addressed to it, over any `Link` (gloo pairs in `prism.runtime.emulate.transport`, in-memory
queues in `PrunedGroup`). A participant's own contribution moves nowhere. The plan per kind:

- reductions (all_reduce[_coalesced], reduce, reduce_scatter[_tensor]): a chain in group order. The first
  participant starts the accumulator (`prefold` of its part), each next one receives it, folds its own
  part onto it (`fold_from`: a live tensor, or a run's recorded tensors one by one) and passes it on; the
  chain's end applies `finish` and sends the result to the sandbox members that need it. Exact: every
  element is folded left to right in group order, as `semantics.reduce` does; one tensor per link,
  whatever the runs' lengths. Where the participants after the last sandbox member supply no more members
  than there are of them (a trailing run of one virtual member; every trailing member without pruning),
  they send their parts to the last sandbox member, which ends the chain (fewer bytes: no result back).
  reduce_scatter folds only the chunks of the sandbox members (elementwise, so the bits are those of
  `semantics.reduce_scatter_chunk`); a reduce to a virtual root, whose result nobody reads, moves nothing.
- all_gather[_into_tensor|_coalesced]: every sandbox participant receives every other participant's
  parts (a compensator's: its run's recorded tensors). gather: the same, to the root only if it is in
  the sandbox.
- broadcast: the root's tensors go from the root's participant to each sandbox participant; scatter: each
  sandbox member gets only its piece.
- all_to_all[_single]: each participant sends a sandbox participant only its members' slices addressed
  to that sandbox member; slices addressed to virtual members are sent nowhere (no peer exists for them).
- barrier: an empty message from every participant to each sandbox participant.
Data-movement kinds send first and then post their receives together (a participant sends only its own
contributions: one round, whatever the plan's order); all_to_all_single slices and all_gather_into_tensor
parts travel bare (`send_tensors`: the receiver knows their shapes from its own contribution), the other
kinds as parts with their metadata. The bytes a plan moves are the tensor bytes of its messages (`PrunedGroup.messages`, the runtime's
`bytes_sent`).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Mapping, Protocol as _Interface, Sequence

import torch

from prism.runtime.emulate import compensation as comp
from prism.runtime import ops
from prism.runtime.semantics import RedOp

KINDS = ops.PROTOCOL  # event op name -> protocol kind
REDUCTIONS = {"all_reduce", "reduce", "reduce_scatter"}

Part = tuple[dict, list[torch.Tensor]]  # a member's contribution: (meta, tensors)


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def participants(members: Sequence[int], sandbox, pruned: bool = True) -> list[tuple[int, list[int]]]:
    """The peers of a group's collectives: (rank, members it supplies), in group order."""
    if pruned:
        return comp.pruned_members(list(members), set(sandbox))
    return [(m, [m]) for m in members]


@dataclass(frozen=True)
class Link:
    src: int  # participant indices
    dst: int
    what: str  # acc | parts | result | root | slices | sync


def contribution(tensors) -> list[torch.Tensor]:
    """A sandbox member's live tensors (detached), not copied: a backend reads an op's input in flight too; a copy
    here cost each issue 0.1-0.5 ms on the program's thread (session 19, docs/results/fidelity/s19/sandbox)."""
    return [t.detach() for t in tensors]


@dataclass
class Protocol:
    """One collective of one group: op (event op name), members, sandbox, participants, root position."""

    op: str
    members: Sequence[int]
    sandbox: set[int]
    parts: list[tuple[int, list[int]]]
    root: int = -1  # group position of the root (broadcast, reduce, gather, scatter)
    links: list[Link] = field(init=False)

    def __post_init__(self) -> None:
        if self.op not in KINDS:
            raise ValueError(f"prism emulate has no pruned protocol for {self.op!r} (it has: {', '.join(KINDS)})")
        self.kind = KINDS[self.op]
        self.members = list(self.members)
        self.n = len(self.members)
        self.pos = {m: i for i, m in enumerate(self.members)}
        self.sandbox = set(self.sandbox) & set(self.members)
        self.owner = {self.pos[m]: i for i, (_, run) in enumerate(self.parts) for m in run}  # position -> part.
        self.runs = [[self.pos[m] for m in run] for _, run in self.parts]  # positions each participant supplies
        self.sbx = [i for i, (r, run) in enumerate(self.parts) if r in self.sandbox and run == [r]]
        self.need = self._need()
        self.end = -1
        self.links = self._plan()

    def _need(self) -> list[int]:
        """Positions of the sandbox members that read this collective's outputs, in group order."""
        spos = sorted(self.pos[r] for r in self.sandbox)
        if self.kind in ("reduce", "gather"):
            return [self.root] if self.root in spos else []
        return spos

    def _plan(self) -> list[Link]:
        k, sbx = len(self.parts), self.sbx
        if not self.need:
            return []
        takers = [self.owner[p] for p in self.need]  # participants that read outputs
        if self.kind in REDUCTIONS:
            last = max(sbx)
            trailing = list(range(last + 1, k))
            direct = trailing and sum(len(self.runs[t]) for t in trailing) <= len(trailing)
            self.end = last if direct else k - 1
            links = [Link(i, i + 1, "acc") for i in range(self.end)]
            if direct:
                links += [Link(t, self.end, "parts") for t in trailing]
            return links + [Link(self.end, d, "result") for d in takers if d != self.end]
        if self.kind in ("broadcast", "scatter"):
            src = self.owner[self.root]
            return [Link(src, d, "root") for d in takers if d != src]
        what = {"all_gather": "parts", "gather": "parts", "all_to_all": "slices", "barrier": "sync"}[self.kind]
        return [Link(p, d, what) for d in takers for p in range(k) if p != d]

    # -- what a participant's contribution is, per kind ------------------------------------------------
    def view(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A member's contribution as the chain folds it: the tensors themselves, or for reduce_scatter only
        the chunks of the members that read outputs (stacked, one tensor per output)."""
        if self.kind != "reduce_scatter":
            return list(tensors)
        idx = torch.tensor(self.need, dtype=torch.long)
        if self.op == "reduce_scatter_tensor":
            t = tensors[0]
            return [t.reshape(self.n, -1).index_select(0, idx.to(t.device))]
        outs = len(tensors) // self.n  # reduce_scatter: output j's inputs are tensors[j*n:(j+1)*n]
        return [torch.stack([tensors[j * self.n + p] for p in self.need]) for j in range(outs)]

    def chunk(self, result: Sequence[torch.Tensor], position: int) -> list[torch.Tensor]:
        """Member `position`'s outputs from the chain's result."""
        if self.kind != "reduce_scatter":
            return list(result)
        i = self.need.index(position)
        return [r[i] for r in result]

    def slice_for(self, part: Part, dst: int) -> list[torch.Tensor]:
        """What member `dst` receives from one member's all-to-all contribution."""
        meta, ts = part
        if self.op == "all_to_all":
            return [ts[dst]]
        t = ts[0]
        splits = list(meta.get("splits") or ()) or [t.shape[0] // self.n] * self.n
        return [t.narrow(0, sum(splits[:dst]), splits[dst])]

    def slices_like(self, part: Part, positions: Sequence[int]) -> list[torch.Tensor]:
        """all_to_all_single: empty tensors shaped as the slices that the member of contribution `part`
        receives from the members at `positions` (its "out_splits" rows; equal splits of its input's rows
        without them): the receiver knows them, so slices travel bare (`Transport.send_tensors`)."""
        meta, ts = part
        t = ts[0]
        outs = list(meta.get("out_splits") or ()) or [t.shape[0] // self.n] * self.n
        return [torch.empty((outs[pos], *t.shape[1:]), dtype=t.dtype) for pos in positions]


class Transport(_Interface):
    """What `run` needs from the wire: sends may be asynchronous, receives block. `send`/`recv` carry
    members' parts with their metadata (sizes unknown to the receiver); `send_tensors`/`recv_tensors`
    carry a reduction's tensors, whose dtypes and shapes the receiver knows (`like`): no header."""

    def send(self, dst: int, parts: list[tuple[int, dict, list[torch.Tensor]]]) -> None: ...

    def recv(self, src: int) -> dict[int, Part]: ...

    # optional: `recv_many(srcs)` -> [recv(src) for src in srcs], the receives posted together

    def send_tensors(self, dst: int, tensors: list[torch.Tensor]) -> None: ...

    def recv_tensors(self, src: int, like: list[torch.Tensor]) -> list[torch.Tensor]: ...


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """The chain's accumulator starts as a copy of a contribution, in host memory (pinned for a CUDA one,
    which `compensation.fold_from` then continues in the CUDA kernel): the chain allocates nothing on a
    sandbox rank's device, whose allocator must see only the program's tensors."""
    if not t.is_cuda:
        return t.clone()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


def _fold_into(acc, op: RedOp, views: list[list[torch.Tensor]]):
    """Continue the chain's left fold (a list of tensors, one per output) over members' views in order."""
    if not views:
        return acc
    if acc is None:
        acc, views = [_host_copy(t) for t in views[0]], views[1:]
    return [comp.fold_from(op, a, [v[j] for v in views]) for j, a in enumerate(acc)]


def run(p: Protocol, me: int, own: Mapping[int, Part], wire: Transport, op: RedOp | None = None) -> dict | None:
    """Participant `me`'s part of collective `p`. `own`: the contributions of the members it supplies
    (group position -> (meta, tensors)). Returns, for a participant whose member reads outputs, its
    outcome: {"result": tensors} (reductions: its outputs) or {"got": {position: (meta, tensors)}} (the
    members' contributions, slices or pieces it receives, its own included); else None."""
    reduction = p.kind in REDUCTIONS
    mine = [pos for pos in p.runs[me] if pos in own]
    if reduction and len(mine) != len(p.runs[me]):
        missing = [p.members[pos] for pos in p.runs[me] if pos not in own]
        raise ValueError(f"{p.op} of group {p.members}: no contribution of members {missing}")
    views = [p.view(own[pos][1]) for pos in mine] if reduction else []
    # received parts stay in host memory: the fold reads them there (a CUDA contribution's fold runs in the
    # CUDA kernel, `compensation.fold_from`, and writes its result to host memory)

    def here(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return ts
    acc, trailing, result, got = None, [], None, {}
    if not reduction:
        if p.kind in ("all_gather", "gather"):
            got.update({pos: own[pos] for pos in mine})
        elif p.kind in ("broadcast", "scatter") and p.root in own:
            meta, ts = own[p.root]
            got[p.root] = (meta, list(ts) if p.kind == "broadcast" else [ts[p.runs[me][0]]])
        elif p.kind == "all_to_all" and p.runs[me][0] in own:
            got.update({pos: (own[pos][0], p.slice_for(own[pos], p.runs[me][0])) for pos in mine})

    def finished():
        nonlocal result
        if result is None:
            folded = _fold_into(_fold_into(acc, op, views), op, trailing)
            result = [comp.finish(op, t, p.n) for t in folded]
        return result

    width = len(views[0]) if views else 0  # tensors per member in a reduction
    # without a header: the receiver knows the shapes (its out_splits; all_gather_into_tensor: its own)
    bare = p.op in ("all_to_all_single", "all_gather_into_tensor")

    def send(link: Link) -> None:
        dst_pos = p.runs[link.dst][0]
        if link.what == "acc":
            wire.send_tensors(link.dst, _fold_into(acc, op, views))
            return
        if link.what == "result":
            wire.send_tensors(link.dst, p.chunk(finished(), dst_pos))
            return
        if link.what == "parts" and reduction:
            wire.send_tensors(link.dst, [t for v in views for t in v])
            return
        if link.what == "parts" and bare:
            wire.send_tensors(link.dst, [t for pos in mine for t in own[pos][1]])
            return
        if link.what == "parts":
            out = [(pos, *own[pos]) for pos in mine]
        elif link.what == "root":
            meta, ts = own[p.root]
            out = [(p.root, meta, list(ts) if p.kind == "broadcast" else [ts[dst_pos]])]
        elif link.what == "slices" and bare:
            wire.send_tensors(link.dst, [t for pos in mine for t in p.slice_for(own[pos], dst_pos)])
            return
        elif link.what == "slices":
            out = [(pos, own[pos][0], p.slice_for(own[pos], dst_pos)) for pos in mine]
        else:
            out = []
        wire.send(link.dst, out)

    if not reduction:
        # data movement: a participant sends only its own contributions, so every send goes out first
        # (asynchronous) and the receives wait together: one round, whatever the plan's order
        for link in p.links:
            if link.src == me:
                send(link)
        srcs = [link.src for link in p.links if link.dst == me]
        if bare:
            mine_part = own[p.runs[me][0]]
            if p.op == "all_to_all_single":
                likes = [p.slices_like(mine_part, p.runs[src]) for src in srcs]
            else:  # all_gather_into_tensor: every member's contribution is shaped as this one's
                likes = [[torch.empty_like(t, device="cpu") for _ in p.runs[src] for t in mine_part[1]]
                         for src in srcs]
            many = getattr(wire, "recv_tensors_many", None)
            k = len(mine_part[1]) if p.op != "all_to_all_single" else 1  # tensors per member
            for src, ts in zip(srcs, many(srcs, likes) if many else map(wire.recv_tensors, srcs, likes)):
                got.update({pos: ({}, ts[i * k:(i + 1) * k]) for i, pos in enumerate(p.runs[src])})
        else:
            many = getattr(wire, "recv_many", None)
            for parts in (many(srcs) if many else [wire.recv(src) for src in srcs]):
                got.update(parts)
    for link in p.links if reduction else ():
        if link.src == me:
            send(link)
        elif link.dst == me:
            if link.what == "acc":
                acc = here(wire.recv_tensors(link.src, views[0]))
            elif link.what == "result":
                result = wire.recv_tensors(link.src, p.chunk(views[0], p.runs[me][0]))
            else:  # a trailing participant's parts
                flat = here(wire.recv_tensors(link.src, views[0] * len(p.runs[link.src])))
                trailing += [flat[k:k + width] for k in range(0, len(flat), width)]
    position = p.runs[me][0]
    if position not in p.need or p.parts[me][1] != [p.parts[me][0]] or p.parts[me][0] not in p.sandbox:
        return None
    if reduction:
        return {"result": p.chunk(finished(), position) if me == p.end or p.end < 0 else result}
    return {"got": got}


# -- the protocol executed in one process (tests, `prism bench pruning`) ----------------------------------------
class _Queues:
    """In-memory wire between the participants of one `PrunedGroup` collective; counts what moves."""

    def __init__(self, group: "PrunedGroup", me: int, boxes: dict) -> None:
        self.group, self.me, self.boxes = group, me, boxes

    def send(self, dst, parts) -> None:
        size = sum(nbytes(ts) for _, _, ts in parts)
        src_rank, dst_rank = self.group.participants[self.me][0], self.group.participants[dst][0]
        with self.group._lock:
            self.group._sent.append((self.me, dst, src_rank, dst_rank, size))
        self.boxes[(self.me, dst)].put({pos: (meta, list(ts)) for pos, meta, ts in parts})

    def recv(self, src):
        return self.boxes[(src, self.me)].get(timeout=60)

    def send_tensors(self, dst, tensors) -> None:
        self.send(dst, [(-1, {}, [t.clone() for t in tensors])])

    def recv_tensors(self, src, like):
        got = self.recv(src)[-1][1]
        assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in like], (got, like)
        return got


@dataclass
class PrunedGroup:
    """One group's pruned collectives, computed by running every participant's `run` (threads over
    queues). Outputs are dicts keyed by sandbox rank; `messages` accumulates every transfer, as
    (src rank, dst rank, nbytes) in plan order."""

    members: Sequence[int]
    sandbox: set[int]
    pruned: bool = True
    messages: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self):
        self.members = list(self.members)
        self.sandbox = set(self.sandbox) & set(self.members)
        self.participants = participants(self.members, self.sandbox, self.pruned)
        self._pos = {r: i for i, r in enumerate(self.members)}
        self._lock = threading.Lock()

    @property
    def n(self) -> int:
        return len(self.members)

    def _inputs(self, live: Mapping[int, object], recorded: Mapping[int, object]) -> None:
        missing_live = sorted(self.sandbox - set(live))
        virtual = [m for m in self.members if m not in self.sandbox]
        missing_rec = [m for m in virtual if m not in recorded]
        if missing_live or missing_rec:
            raise ValueError(f"group {self.members}: no live contribution from sandbox ranks {missing_live} / "
                             f"no recorded one from virtual ranks {missing_rec}")

    def execute(self, op: str, contributions: Mapping[int, Part], red: RedOp | None = None,
                root: int = -1) -> dict[int, dict | None]:
        """Run collective `op` (event op name) over every member's (meta, tensors) (keyed by rank; root a
        rank): each participant in its own thread. Returns each sandbox rank's outcome (see `run`)."""
        proto = Protocol(op, self.members, self.sandbox, self.participants,
                         self._pos[root] if root >= 0 else -1)
        boxes = {(link.src, link.dst): queue.Queue() for link in proto.links}
        self._sent = []
        outcomes, errors = {}, []

        def one(i: int) -> None:
            own = {self._pos[m]: contributions[m] for m in self.participants[i][1] if m in contributions}
            try:
                outcomes[i] = run(proto, i, own, _Queues(self, i, boxes), red)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(self.participants))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        order = {(link.src, link.dst): k for k, link in enumerate(proto.links)}
        self.messages += [(s, d, b) for i, j, s, d, b in sorted(self._sent, key=lambda m: order[m[:2]])]
        return {r: outcomes[i] for i, (r, run_) in enumerate(self.participants) if r in self.sandbox}

    def _reduction(self, opname, op, live, recorded, root=-1):
        self._inputs(live, recorded)
        contribs = {m: ({}, [live[m] if m in self.sandbox else recorded[m]]) for m in self.members}
        return self.execute(opname, contribs, op, root)

    # -- the kinds, with plain tensors in and out ----------------------------------------------------------
    def all_reduce(self, op: RedOp, live, recorded) -> dict[int, torch.Tensor]:
        return {r: o["result"][0] for r, o in self._reduction("all_reduce", op, live, recorded).items()}

    def reduce(self, op: RedOp, root: int, live, recorded) -> dict[int, torch.Tensor | None]:
        out = self._reduction("reduce", op, live, recorded, root)
        return {r: (o["result"][0] if o else None) for r, o in out.items()}

    def reduce_scatter(self, op: RedOp, live, recorded) -> dict[int, torch.Tensor]:
        """Flat inputs split into n equal chunks (dim 0); member at position i gets chunk i."""
        some = next(iter(live.values()), None)
        some = some if some is not None else next(iter(recorded.values()))
        if some.numel() % self.n:
            raise ValueError(f"reduce_scatter over {self.n} members: input of {some.numel()} elements does not "
                             f"split into {self.n} equal chunks")
        out = self._reduction("reduce_scatter_tensor", op, live, recorded)
        return {r: o["result"][0] for r, o in out.items()}

    def _moved(self, op, live, recorded, root=-1, meta=None):
        self._inputs(live, recorded)
        contribs = {m: ((meta or {}).get(m, {}), [live[m] if m in self.sandbox else recorded[m]])
                    for m in self.members}
        return self.execute(op, contribs, None, root)

    def all_gather(self, live, recorded) -> dict[int, list[torch.Tensor]]:
        out = self._moved("all_gather_into_tensor", live, recorded)
        return {r: [o["got"][i][1][0] for i in range(self.n)] for r, o in out.items()}

    def gather(self, dst: int, live, recorded) -> dict[int, list[torch.Tensor] | None]:
        out = self._moved("gather", live, recorded, dst)
        return {r: ([o["got"][i][1][0] for i in range(self.n)] if o else None) for r, o in out.items()}

    def broadcast(self, src: int, live, recorded) -> dict[int, torch.Tensor]:
        """`live`/`recorded` hold the source's tensor under `src` (the others' are not needed)."""
        contribs = {src: ({}, [live[src] if src in self.sandbox else recorded[src]])}
        out = self.execute("broadcast", contribs, None, src)
        return {r: o["got"][self._pos[src]][1][0] for r, o in out.items()}

    def scatter(self, src: int, live, recorded) -> dict[int, torch.Tensor]:
        """The source's list of n tensors (group order) under `src`; member at position i gets item i."""
        pieces = live[src] if src in self.sandbox else recorded[src]
        if len(pieces) != self.n:
            raise ValueError(f"scatter from {src}: {len(pieces)} tensors for {self.n} members")
        out = self.execute("scatter", {src: ({}, list(pieces))}, None, src)
        return {r: o["got"][self._pos[src]][1][0] for r, o in out.items()}

    def all_to_all_single(self, in_splits: Mapping[int, Sequence[int]], live, recorded) -> dict[int, torch.Tensor]:
        """`in_splits[m]`: member m's input split sizes along dim 0 (empty: equal splits)."""
        def rows(m: int) -> list[int]:  # member m's input split sizes, explicit
            t = live[m] if m in self.sandbox else recorded[m]
            return list(in_splits.get(m, ())) or [t.shape[0] // self.n] * self.n

        meta = {m: {"splits": list(in_splits.get(m, ())), "out_splits": [rows(s)[i] for s in self.members]}
                for i, m in enumerate(self.members)}
        out = self._moved("all_to_all_single", live, recorded, meta=meta)
        return {r: torch.cat([o["got"][i][1][0] for i in range(self.n)]) for r, o in out.items()}

    # -- accounting ------------------------------------------------------------------------------------
    def bytes_moved(self) -> int:
        return sum(b for _, _, b in self.messages)


def ring_all_reduce_bytes(n: int, nbytes: int) -> int:
    """Bytes a ring all-reduce of n members moves in all: each member sends 2(n-1) chunks of nbytes/n."""
    return 0 if n <= 1 else 2 * (n - 1) * nbytes


def individual_all_reduce_bytes(members: Sequence[int], sandbox: set[int], nbytes: int) -> int:
    """Bytes if, instead of the chain, every sandbox member gathered what it must fold itself: the leading
    run's prefold and every other contribution after the first sandbox member one by one (a float
    SUM/AVG/PRODUCT run after a sandbox member cannot be pre-folded)."""
    pos = [i for i, m in enumerate(members) if m in sandbox]
    if not pos:
        return 0
    first, n = pos[0], len(members)
    per_member = (1 if first > 0 else 0) + (n - first - 1)
    return len(pos) * per_member * nbytes
