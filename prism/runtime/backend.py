"""The prism process group: one backend for every mode, substituted for every group the program makes.

Each call is recorded in the rank's PrismTrace (op, group, per-group sequence, peer, tag, bytes, dtype,
shape, work id) and handed to the mode's transport for the data movement. Its `Work` records the wait.
Every method is hidden from Dynamo: `torch.compile` of a DDP model must not trace into the backend.
"""

from __future__ import annotations

import itertools
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work, _create_work_from_future

from prism import schemas
from prism.runtime import float8_over_gloo, semantics, unsupported, watchdog
from prism.runtime.recorder import Recorder
from prism.runtime.transport import Transport

_work_ids = itertools.count()
_nodynamo = torch.compiler.disable


def flat_tensors(tensors) -> list[torch.Tensor]:
    """The tensors of an op's argument (a tensor list, or lists of them), flattened in order."""
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            out.append(t)
        else:
            out.extend(flat_tensors(t))
    return out


def _called_by_torch_blocking_api() -> bool:
    """Whether the wait comes from torch's own synchronous call (`dist.all_reduce(t)` waits at once)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith("eval_frame.py"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.endswith("distributed_c10d.py")


def _describe(tensors) -> tuple[int, str | None, str | None, torch.device]:
    flat = flat_tensors(tensors)
    if not flat:
        return 0, None, None, torch.device("cpu")
    first = flat[0]
    nbytes = sum(t.numel() * t.element_size() for t in flat)
    shape = "x".join(map(str, first.shape)) or "scalar"
    return nbytes, str(first.dtype).removeprefix("torch."), shape, first.device


def _outputs(args: tuple) -> list[torch.Tensor]:
    """The tensors an op writes: its first argument in the `Backend` calling convention (none: barrier)."""
    first = args[0] if args else None
    if isinstance(first, torch.Tensor):
        return [first]
    if isinstance(first, (list, tuple)):
        return flat_tensors(first)
    return []


def _done_work(outputs: list[torch.Tensor]) -> Work:
    """A completed work holding `outputs`.

    NCCL runs an op that was not asked for asynchronously (`opts.asyncOp` False: `dist.all_reduce(t)`,
    `dist.send`) synchronised at the C++ level (the current stream waits on the NCCL stream) and returns
    no work; torch's Python API then waits on nothing. Prism's backend always returns a work, so that the
    wait is recorded: for such an op, one that is complete (stream-ordered, like NCCL's own)."""
    fut = torch.futures.Future()
    fut.set_result(outputs)
    return _create_work_from_future(fut)


def _future_of(work: Work) -> torch.futures.Future | None:
    """The work's future, or None where the backend has none (gloo: send/recv, reduce_scatter)."""
    try:
        return work.get_future()
    except RuntimeError:
        return None


def _future_by_waiting(work: Work) -> torch.futures.Future:
    """A future completed by a helper thread that waits on `work` (for works that have none)."""
    fut = torch.futures.Future()

    def waiter():
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(exc)
            return
        try:
            result = work.result()
        except RuntimeError:  # gloo's send/recv and reduce_scatter works keep no result
            result = []
        fut.set_result(result)

    threading.Thread(target=waiter, name="prism-work-future", daemon=True).start()
    return fut


def _distinct(works) -> list[Work]:
    """The works, each once (an NCCL coalesced batch: one work for all its ops), none unresolved."""
    seen, out = set(), []
    for w in works:
        if w is not None and id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


class PrismWork(Work):
    """Wraps the transport's work; records when the program waits on it."""

    def __init__(self, inner: list[Work], recorder: Recorder | None, work_ids: list[int], op: str,
                 group: str, anysource: list[int] | None = None) -> None:
        super().__init__()
        self._inner, self._rec, self._ids, self._op, self._group = inner, recorder, work_ids, op, group
        self._waited = False
        self._futured = False
        # a recv from any source: the group's global ranks (its sender is recorded once it is known)
        self._anysource = anysource

    def _record_source(self) -> None:
        """A completed recv from any source: its recv event's peer becomes the rank it received from."""
        if self._anysource is not None and self._rec is not None:
            members, self._anysource = self._anysource, None
            self._rec.resolve_peer(self._ids[0], members[self._inner[0]._source_rank()])

    @_nodynamo
    def wait(self, timeout: timedelta | None = None) -> bool:
        rec = self._rec
        # one wait event per op: a work waited again (functional collectives wait once per output
        # tensor of a coalesced op) is already complete
        record = rec is not None and not self._waited
        self._waited = True
        sync = record and _called_by_torch_blocking_api()
        for inner, wid in zip(self._inner, self._ids):
            if inner is None:  # an op inside NCCL coalescing: it runs at `_end_coalescing` (see `resolve`)
                continue
            if not record:
                inner.wait()
                continue
            rec.waited(wid, sync)
            start = rec.begin()
            ready = inner.is_completed()
            inner.wait()
            rec.end(start, schemas.KIND_WAIT, self._op, group=self._group, work_id=wid)
            # an upper bound of when the result was ready: the wait's start if it was there already,
            # else the wait's end
            rec.completed_by(wid, start[0] if ready else rec.last_end_ns)
        self._record_source()
        return True

    def resolve(self, work: Work | None, outputs: list[torch.Tensor]) -> None:
        """An op issued inside coalescing completes with `work`, the batch's (NCCL: the ops run when the
        batch ends; the work NCCL gave an op inside it, if any, does not wait for that). Where the backend
        gave no batch work (gloo: no coalescing), the op's own work stays; none at all: complete."""
        if work is not None:
            self._inner = [work for _ in self._inner]
        else:
            self._inner = [_done_work(outputs) if w is None else w for w in self._inner]

    @_nodynamo
    def get_future(self) -> torch.futures.Future:
        futs = [_future_of(w) or _future_by_waiting(w) for w in _distinct(self._inner)]
        if self._rec is not None and not self._futured:
            # consumed through its future (DDP): its completion time is only known from a callback
            self._futured = True
            rec = self._rec
            by_work = dict(zip(map(id, _distinct(self._inner)), futs))
            for inner, wid in zip(self._inner, self._ids):
                if inner is not None:
                    by_work[id(inner)].add_done_callback(lambda _f, wid=wid: rec.completed(wid))
            if self._anysource is not None:
                futs[0].add_done_callback(lambda _f: self._record_source())
        if len(futs) == 1:
            return futs[0]
        # several works (a coalesced op, a batch of p2p ops): one future of all their output tensors
        return torch.futures.collect_all(futs).then(lambda f: [t for x in f.value() for t in x.value()])

    @_nodynamo
    def is_completed(self) -> bool:
        return all(w is not None and w.is_completed() for w in self._inner)

    @_nodynamo
    def is_success(self) -> bool:
        return all(w is not None and w.is_success() for w in self._inner)

    @_nodynamo
    def exception(self):
        for w in _distinct(self._inner):
            if w.exception() is not None:
                return w.exception()
        return None

    @_nodynamo
    def result(self) -> list[torch.Tensor]:
        return [t for w in _distinct(self._inner) for t in w.result()]

    @_nodynamo
    def synchronize(self) -> None:
        for w in _distinct(self._inner):
            w.synchronize()

    @_nodynamo
    def _source_rank(self) -> int:  # a recv from any source: who sent (group rank)
        self._record_source()
        return self._inner[0]._source_rank()


class _Joined(PrismWork):
    """Several issued ops waited together (a coalesced op, a batch of p2p ops).

    Its inner works are read from the op works when used, so that ops resolved after issue (NCCL
    coalescing: one work stands for the whole batch) are seen."""

    def __init__(self, works: list[PrismWork], recorder: Recorder | None, op: str, group: str) -> None:
        super().__init__([], recorder, [], op, group)
        self._works = works

    @property
    def _inner(self):
        return [w._inner[0] for w in self._works]

    @_inner.setter
    def _inner(self, value):  # set by PrismWork.__init__ (empty)
        pass

    @property
    def _ids(self):
        return [w._ids[0] for w in self._works]

    @_ids.setter
    def _ids(self, value):
        pass


class PrismProcessGroup(dist.ProcessGroup):
    """A process group whose calls are recorded and carried by a `Transport`."""

    computes = False  # the transport computes collectives itself (capture, slice, emulate): ops are checked
    uncarried: tuple[str, str | None] | None = None  # (backend asked for, desc): a group prism cannot carry
    float8_as_bytes = False  # its transport hands ops to gloo itself (slice): float8 data goes as uint8

    def __init__(self, group_rank: int, group_size: int, global_ranks: list[int], group_name: str,
                 desc: str | None, transport: Transport, recorder: Recorder | None,
                 backend_name: str = "gloo") -> None:
        super().__init__(group_rank, group_size)
        self._global_ranks = global_ranks
        self._name = group_name
        self._desc = desc
        self._transport = transport
        self._rec = recorder
        self._backend_name = backend_name
        self._seq = 0  # per-group sequence number of collectives
        self._coalesced: list[tuple[Work, int]] | None = None

    # -- identity --------------------------------------------------------------------------------------
    # C++ (DDP's logger) looks the named backend up in the group: it must stay "prism". What the program
    # asked for ("gloo", "nccl") is what `dist.get_backend(group)` reports (interception fixes c10d's map).
    def getBackendName(self) -> str:
        return "prism"

    def name(self) -> str:
        return "prism"

    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc or ""

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc or ""

    # -- the one path every op takes -------------------------------------------------------------------
    def _issue(self, op: str, kind: str, method: str, tensors, args: tuple, peer: int = -1,
               tag: int = 0, anysource: bool = False) -> Work:
        if self.uncarried is not None:
            unsupported.check_backend(*self.uncarried, op=op)
        if self.computes:
            flat = flat_tensors(tensors)
            unsupported.check_op(op, f"{self._name} ({self._desc or 'no description'})", flat, args,
                                  semantics.REDUCTIONS)
            if self.float8_as_bytes and float8_over_gloo.any_one_byte_float(flat):
                args = float8_over_gloo.as_bytes(args)  # gloo moves no float8 (its reductions were refused above)
        nbytes, dtype, shape, device = _describe(tensors)
        rec = self._rec
        wid = next(_work_ids)
        if kind == schemas.KIND_COLLECTIVE:
            gseq = self._seq
            self._seq += 1
        else:
            gseq = -1
        if rec is not None:
            rec.check(kind, op, self._name, gseq, peer, tag, nbytes)
            start = rec.begin()
        inner = self._transport.call(method, device, *args, work_id=wid, op=op)
        if inner is None and self._coalesced is None:  # NCCL, not async: synchronised already
            inner = _done_work(_outputs(args))
        if watchdog.active is not None and inner is not None:  # real mode: a hang is named, not waited out
            watchdog.active.issued(self, inner, op, gseq, peer, tag, dtype, shape)
        if rec is not None:
            rec.end(start, kind, op, group=self._name, group_seq=gseq, peer=peer, tag=tag, nbytes=nbytes,
                    dtype=dtype, shape=shape, work_id=wid)
            if anysource:
                rec.await_peer(wid)
            # No completion callback here: it runs on the backend's thread and costs a GIL hand-off per
            # op. A waited op's completion is seen at its wait; a future's consumer gets one (get_future).
        work = PrismWork([inner], rec, [wid], op, self._name, self._global_ranks if anysource else None)
        if self._coalesced is not None:
            self._coalesced.append((work, _outputs(args)))
        return work

    def _root(self, opts) -> int:
        return self._global_ranks[opts.rootRank]

    # -- collectives -----------------------------------------------------------------------------------
    @_nodynamo
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self._issue("all_reduce", schemas.KIND_COLLECTIVE, "allreduce", tensors, (tensors, opts))

    @_nodynamo
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        return self._issue("all_reduce_coalesced", schemas.KIND_COLLECTIVE, "allreduce_coalesced", tensors,
                           (tensors, opts))

    @_nodynamo
    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._issue("all_gather_coalesced", schemas.KIND_COLLECTIVE, "allgather_coalesced", input_tensors,
                           (output_lists, input_tensors, opts))

    @_nodynamo
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._issue("all_gather", schemas.KIND_COLLECTIVE, "allgather", input_tensors,
                           (output_tensors, input_tensors, opts))

    @_nodynamo
    def all_gather_single(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._issue("all_gather_into_tensor", schemas.KIND_COLLECTIVE, "all_gather_single", [input],
                           (output, input, opts))

    _allgather_base = all_gather_single

    @_nodynamo
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        return self._combine("all_gather_into_tensor", "all_gather_single", list(zip(outputs, inputs)), opts)

    @_nodynamo
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._issue("reduce_scatter", schemas.KIND_COLLECTIVE, "reduce_scatter", input_tensors,
                           (output_tensors, input_tensors, opts))

    @_nodynamo
    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._issue("reduce_scatter_tensor", schemas.KIND_COLLECTIVE, "reduce_scatter_single", [input],
                           (output, input, opts))

    _reduce_scatter_base = reduce_scatter_single

    @_nodynamo
    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._combine("reduce_scatter_tensor", "reduce_scatter_single", list(zip(outputs, inputs)), opts)

    def _combine(self, op: str, method: str, pairs, opts) -> Work:
        """A coalesced op as one recorded op per tensor pair, waited together."""
        works = [self._issue(op, schemas.KIND_COLLECTIVE, method, [i], (o, i, opts)) for o, i in pairs]
        return _Joined(works, self._rec, op, self._name)

    @_nodynamo
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        return self._issue("all_to_all_single", schemas.KIND_COLLECTIVE, "alltoall_base", [input],
                           (output, input, output_split_sizes, input_split_sizes, opts))

    all_to_all_single = alltoall_base

    @_nodynamo
    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllToAllOptions()
        return self._issue("all_to_all", schemas.KIND_COLLECTIVE, "alltoall", input_tensors,
                           (output_tensors, input_tensors, opts))

    @_nodynamo
    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return self._issue("broadcast", schemas.KIND_COLLECTIVE, "broadcast", tensors, (tensors, opts),
                           peer=self._root(opts))

    @_nodynamo
    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        return self._issue("reduce", schemas.KIND_COLLECTIVE, "reduce", tensors, (tensors, opts),
                           peer=self._root(opts))

    @_nodynamo
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        return self._issue("gather", schemas.KIND_COLLECTIVE, "gather", input_tensors,
                           (output_tensors, input_tensors, opts), peer=self._root(opts))

    @_nodynamo
    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        return self._issue("scatter", schemas.KIND_COLLECTIVE, "scatter", output_tensors,
                           (output_tensors, input_tensors, opts), peer=self._root(opts))

    @_nodynamo
    def barrier(self, opts=None):
        opts = opts or dist.BarrierOptions()
        return self._issue("barrier", schemas.KIND_COLLECTIVE, "barrier", [], (opts,))

    @_nodynamo
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier: a barrier waited at once (a hang is prism's to report)."""
        self.barrier().wait()

    # -- point to point ----------------------------------------------------------------------------------
    @_nodynamo
    def send(self, tensors, dstRank, tag):
        return self._issue("send", schemas.KIND_SEND, "send", tensors, (tensors, dstRank, tag),
                           peer=self._global_ranks[dstRank], tag=tag)

    @_nodynamo
    def recv(self, tensors, srcRank, tag):
        return self._issue("recv", schemas.KIND_RECV, "recv", tensors, (tensors, srcRank, tag),
                           peer=self._global_ranks[srcRank], tag=tag)

    @_nodynamo
    def recv_anysource(self, tensors, tag):  # the sender is known once received: recorded then (peer)
        return self._issue(schemas.OP_RECV_ANYSOURCE, schemas.KIND_RECV, "recv_anysource", tensors,
                           (tensors, tag), tag=tag, anysource=True)

    # -- coalescing (batch_isend_irecv, coalescing manager) ---------------------------------------------
    @_nodynamo
    def _start_coalescing(self, device):
        self._coalesced = []
        self._transport.start_coalescing(device)

    @_nodynamo
    def _end_coalescing(self, device):
        issued, self._coalesced = self._coalesced or [], None
        end = self._transport.end_coalescing(device)  # NCCL: the one work of the whole batch
        for work, outputs in issued:
            work.resolve(end, outputs)
        return _Joined([w for w, _ in issued], self._rec, "coalesced", self._name)
