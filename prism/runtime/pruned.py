"""Pruned collectives as pure functions: each sandbox member's outputs, computed the way the pruned protocol
moves data, and the messages it sends (so the pruning table counts bytes from the protocol itself).

A group has `members` in group (ring) order; `sandbox` ranks contribute live tensors, every other member
(virtual) its recorded one. Participants are `compensation.pruned_members`: the sandbox members and one
compensator per run of consecutive virtual members. The protocol per kind:

- reductions (all_reduce, reduce, reduce_scatter): a chain in group order. The first participant starts
  the accumulator (a leading run's `prefold`, or a sandbox member's live tensor), each next participant
  receives it, folds its own part onto it (`fold_from`: one live tensor, or a run's recorded tensors one by
  one) and passes it on; the last one applies `finish` and sends the result to the sandbox members that
  need it. Exact: every element is folded left to right in group order, as `semantics.reduce` does; one
  tensor per link, whatever the runs' lengths. (reduce_scatter moves all chunks along the chain and
  delivers each sandbox member its chunk.)
- all_gather, gather: every sandbox member that receives gets every other member's tensor (a run's
  compensator sends its members' recorded tensors).
- broadcast, scatter: the source's tensor(s) go to each sandbox member (from the source if it is in the
  sandbox, else from the compensator of its run).
- all_to_all_single: a sandbox member receives its slice from every other member; slices addressed to
  virtual members are not sent anywhere (no peer exists for them).
Messages are `(src, dst, nbytes)` between participants; a participant's own contribution moves nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from prism.runtime import compensation as comp
from prism.runtime import semantics
from prism.runtime.semantics import RedOp


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class PrunedGroup:
    """One group's pruned collectives. Outputs are dicts keyed by sandbox rank; `messages` accumulates
    every transfer the protocol makes, as (src, dst, nbytes)."""

    members: Sequence[int]
    sandbox: set[int]
    messages: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self):
        self.members = list(self.members)
        self.sandbox = set(self.sandbox) & set(self.members)
        self.participants = comp.pruned_members(self.members, self.sandbox)
        self._pos = {r: i for i, r in enumerate(self.members)}
        self._owner = {m: rank for rank, run in self.participants for m in run}   # who supplies member m

    @property
    def n(self) -> int:
        return len(self.members)

    def _inputs(self, live: Mapping[int, object], recorded: Mapping[int, object]) -> list:
        missing_live = sorted(self.sandbox - set(live))
        virtual = [m for m in self.members if m not in self.sandbox]
        missing_rec = [m for m in virtual if m not in recorded]
        if missing_live or missing_rec:
            raise ValueError(f"group {self.members}: no live contribution from sandbox ranks {missing_live} / "
                             f"no recorded one from virtual ranks {missing_rec}")
        return [live[m] if m in self.sandbox else recorded[m] for m in self.members]

    def _send(self, src: int, dst: int, nbytes: int) -> None:
        if src != dst:
            self.messages.append((src, dst, nbytes))

    # -- reductions ------------------------------------------------------------------------------------

    def _chain(self, op: RedOp, xs: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
        """The chain fold over all participants; returns the finished result and who holds it."""
        acc, holder = None, None
        for rank, run in self.participants:
            part = [xs[self._pos[m]] for m in run]
            if acc is None:
                acc = comp.prefold(op, part)
            else:
                self._send(holder, rank, _nbytes(acc))
                acc = comp.fold_from(op, acc, part)
            holder = rank
        return comp.finish(op, acc, self.n), holder

    def all_reduce(self, op: RedOp, live, recorded) -> dict[int, torch.Tensor]:
        result, holder = self._chain(op, self._inputs(live, recorded))
        for r in sorted(self.sandbox, key=self._pos.get):
            self._send(holder, r, _nbytes(result))
        return {r: result for r in self.sandbox}

    def reduce(self, op: RedOp, root: int, live, recorded) -> dict[int, torch.Tensor | None]:
        result, holder = self._chain(op, self._inputs(live, recorded))
        if root in self.sandbox:
            self._send(holder, root, _nbytes(result))
        return {r: (result if r == root else None) for r in self.sandbox}

    def reduce_scatter(self, op: RedOp, live, recorded) -> dict[int, torch.Tensor]:
        """Flat inputs split into n equal chunks (dim 0); member at position i gets chunk i."""
        xs = self._inputs(live, recorded)
        if xs[0].numel() % self.n:
            raise ValueError(f"reduce_scatter over {self.n} members: input of {xs[0].numel()} elements does not "
                             f"split into {self.n} equal chunks")
        full, holder = self._chain(op, [x.reshape(self.n, -1) for x in xs])
        # fold_chunks folds each chunk's own views, exactly as semantics.reduce_scatter_chunk does; the
        # chain above produced the same elements and accounted for the messages.
        out = {}
        for r in self.sandbox:
            c = self._pos[r]
            out[r] = comp.fold_chunks(op, xs, self.n, [c])[0]
            self._send(holder, r, _nbytes(full[c]))
        return out

    # -- data movement ---------------------------------------------------------------------------------

    def all_gather(self, live, recorded) -> dict[int, list[torch.Tensor]]:
        xs = self._inputs(live, recorded)
        for r in self.sandbox:
            for m, x in zip(self.members, xs):
                self._send(self._owner[m], r, _nbytes(x))
        return {r: semantics.all_gather(xs) for r in self.sandbox}

    def gather(self, dst: int, live, recorded) -> dict[int, list[torch.Tensor] | None]:
        xs = self._inputs(live, recorded)
        if dst in self.sandbox:
            for m, x in zip(self.members, xs):
                self._send(self._owner[m], dst, _nbytes(x))
        return {r: (list(xs) if r == dst else None) for r in self.sandbox}

    def broadcast(self, src: int, live, recorded) -> dict[int, torch.Tensor]:
        """`live`/`recorded` hold the source's tensor under `src` (the others' are not needed)."""
        x = live[src] if src in self.sandbox else recorded[src]
        for r in self.sandbox:
            self._send(self._owner[src], r, _nbytes(x))
        return {r: x for r in self.sandbox}

    def scatter(self, src: int, live, recorded) -> dict[int, torch.Tensor]:
        """The source's list of n tensors (group order) under `src`; member at position i gets item i."""
        pieces = live[src] if src in self.sandbox else recorded[src]
        if len(pieces) != self.n:
            raise ValueError(f"scatter from {src}: {len(pieces)} tensors for {self.n} members")
        out = {}
        for r in self.sandbox:
            out[r] = pieces[self._pos[r]]
            self._send(self._owner[src], r, _nbytes(out[r]))
        return out

    def all_to_all_single(self, in_splits: Mapping[int, Sequence[int]], live, recorded) -> dict[int, torch.Tensor]:
        """`in_splits[m]`: member m's input split sizes along dim 0 (empty: equal splits)."""
        xs = self._inputs(live, recorded)
        splits = [list(in_splits.get(m, ())) for m in self.members]
        out = {}
        for r in self.sandbox:
            me = self._pos[r]
            out[r] = semantics.all_to_all_single(xs, splits, me)
            for i, (m, x) in enumerate(zip(self.members, xs)):
                sp = splits[i] or [x.shape[0] // self.n] * self.n
                row = x[0].numel() * x.element_size() if x.dim() else x.element_size()
                self._send(self._owner[m], r, sp[me] * row)
        return out

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
