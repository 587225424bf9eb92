"""The collectives computed from the members' contributions: what capture and emulate share.

`ContributionTransport` implements every collective of one process group as "contribute this rank's
tensors, then complete from the members' contributions" (`semantics` defines the values): the op's
arguments become a contribution and a completion function, per op (`_allreduce`, `_allgather`, ...; the
op table is `ops`). A mode gives the exchange: `_collective` (contribute, and return the work whose wait
completes), `_inputs` / `_contribution` (the members' contributions, read back) and `_keep` (what a
reduction's result leaves behind). Capture exchanges through shared memory under the coordinator
(`capture.transport`), emulate through the pruned protocol with the replayed ranks (`emulate.transport`).
"""

from __future__ import annotations

import torch

from prism.runtime import semantics


class ContributionTransport:
    """The transport of one group whose collectives complete from the members' contributions."""

    __slots__ = ()
    group: str
    me: int  # this rank's position in the group
    members: tuple[int, ...]
    n: int

    def _collective(self, op: str, work_id: int, mine: list[torch.Tensor] | None, complete, result,
                    meta: dict | None = None, info_tensors: list[torch.Tensor] | None = None,
                    reads: list[int] | None | str = "all"):
        raise NotImplementedError

    def _keep(self, key: tuple, outputs, work_id: int) -> None:
        raise NotImplementedError

    def _inputs(self, key: tuple, members=None):
        """(meta, tensors) of the members' contributions, in group order (all, or `members`)."""
        raise NotImplementedError

    def _contribution(self, key: tuple, member: int) -> tuple[dict, list[torch.Tensor]]:
        raise NotImplementedError

    def start_coalescing(self, device) -> None:
        pass

    def end_coalescing(self, device):
        return None

    def call(self, method: str, device, *args, work_id: int = -1, op: str = ""):
        handler = getattr(self, "_" + method, None)
        if handler is None:
            raise RuntimeError(f"prism capture does not support {method} yet")  # (the message predates emulate)
        return handler(work_id, op, *args)

    def _fold(self, key: tuple, red, pick) -> list[torch.Tensor]:
        """`semantics.reduce` of each tensor `pick(member's tensors)[j]` over the members, streamed."""
        folds = None
        for _, ts in self._inputs(key):
            picked = pick(ts)
            folds = folds or [semantics.Fold(red) for _ in picked]
            for f, t in zip(folds, picked):
                f.add(t)
        return [f.result() for f in folds or []]

    def _reduced(self, key: tuple, red) -> list[torch.Tensor]:
        """An all-reduce's value: the members' contributions folded in group order (the same for every member)."""
        return self._fold(key, red, lambda ts: ts)

    def _allreduce(self, work_id, op, tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            for t, r in zip(tensors, self._reduced(key, red)):
                semantics.write(t, r)
            self._keep(key, tensors, work_id)

        return self._collective(op, work_id, list(tensors), complete, list(tensors), meta={"reduce_op": red.name})

    _allreduce_coalesced = _allreduce

    def _allgather(self, work_id, op, output_tensors, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                for j, out in enumerate(output_tensors):
                    semantics.write(out[k], ts[j])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors)

    def _all_gather_single(self, work_id, op, output, input, opts):
        def complete(key):
            rows = output.view(self.n, -1)
            for k, (_, ts) in enumerate(self._inputs(key)):
                semantics.write(rows[k], ts[0].reshape(-1))

        return self._collective(op, work_id, [input], complete, [output])

    def _reduce_scatter(self, work_id, op, output_tensors, input_tensors, opts):
        red = semantics.red_op(opts)

        def complete(key):
            mine = [j * self.n + self.me for j in range(len(output_tensors))]
            for out, r in zip(output_tensors, self._fold(key, red, lambda ts: [ts[i] for i in mine])):
                semantics.write(out, r)
            self._keep(key, output_tensors, work_id)

        flat = [t for lst in input_tensors for t in lst]
        return self._collective(op, work_id, flat, complete, output_tensors, meta={"reduce_op": red.name})

    def _reduce_scatter_single(self, work_id, op, output, input, opts):
        red = semantics.red_op(opts)

        def complete(key):
            chunk = self._fold(key, red, lambda ts: [ts[0].reshape(self.n, -1)[self.me]])[0]
            semantics.write(output, chunk.view_as(output))
            self._keep(key, [output], work_id)

        return self._collective(op, work_id, [input], complete, [output], info_tensors=[input],
                                meta={"reduce_op": red.name})

    def _alltoall_base(self, work_id, op, output, input, output_split_sizes, input_split_sizes, opts):
        def complete(key):
            got = list(self._inputs(key))
            ins = [ts[0] for _, ts in got]
            splits = [meta["splits"] for meta, _ in got]
            semantics.write(output, semantics.all_to_all_single(ins, splits, self.me).view_as(output))

        return self._collective(op, work_id, [input], complete, [output],
                                meta={"splits": list(input_split_sizes), "out_splits": list(output_split_sizes)})

    def _alltoall(self, work_id, op, output_tensors, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                semantics.write(output_tensors[k], ts[self.me])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors)

    def _broadcast(self, work_id, op, tensors, opts):
        root = opts.rootRank

        def complete(key):
            if self.me != root:
                _, ts = self._contribution(key, root)
                for t, src in zip(tensors, ts):
                    semantics.write(t, src)

        mine = list(tensors) if self.me == root else None
        return self._collective(op, work_id, mine, complete, list(tensors), info_tensors=list(tensors),
                                reads=[] if self.me == root else [root])

    def _reduce(self, work_id, op, tensors, opts):
        red, root = semantics.red_op(opts), opts.rootRank

        def complete(key):
            if self.me == root:
                for t, r in zip(tensors, self._fold(key, red, lambda ts: ts)):
                    semantics.write(t, r)
                self._keep(key, tensors, work_id)

        return self._collective(op, work_id, list(tensors), complete, list(tensors),
                                reads="all" if self.me == root else [], meta={"reduce_op": red.name, "root": root})

    def _gather(self, work_id, op, output_tensors, input_tensors, opts):
        root = opts.rootRank

        def complete(key):
            if self.me == root:
                for k, (_, ts) in enumerate(self._inputs(key)):
                    semantics.write(output_tensors[0][k], ts[0])

        return self._collective(op, work_id, list(input_tensors), complete, output_tensors,
                                reads="all" if self.me == root else [])

    def _scatter(self, work_id, op, output_tensors, input_tensors, opts):
        root = opts.rootRank

        def complete(key):
            _, ts = self._contribution(key, root)
            semantics.write(output_tensors[0], ts[self.me])

        mine = list(input_tensors[0]) if self.me == root else None
        return self._collective(op, work_id, mine, complete, output_tensors, info_tensors=list(output_tensors),
                                reads=[root])

    def _barrier(self, work_id, op, opts):
        return self._collective(op, work_id, None, lambda key: None, [], reads=None)

    def _allgather_coalesced(self, work_id, op, output_lists, input_tensors, opts):
        def complete(key):
            for k, (_, ts) in enumerate(self._inputs(key)):
                for j, out in enumerate(output_lists[k]):
                    semantics.write(out, ts[j])

        return self._collective(op, work_id, list(input_tensors), complete, output_lists)
