"""Mode `slice`, rank side: the recorder that checks every communication op against the capture.

A slice rank must issue exactly the communication ops it issued in the capture: the replay server
answers from the capture, so a rank that diverges (another program or arguments, a nondeterministic
program) would otherwise hang waiting for an op no one replays, or exchange wrongly sized data.
`SliceRecorder` compares each op (kind, op, group, per-group sequence, peer, tag, bytes) with the rank's
captured op stream (`PRISM_CAPTURE/raw/rank=R/events.arrow`) as it is issued, and stops the rank at the
first difference with a message naming both.

`SliceTransport` is the real transport with one correction: a floating-point reduction in a group of more
than two members gets the capture's result (`role == "out"` rows of the rank's payload index). The real
backend reduces in its own order (gloo's ring, chunked), prism's capture in a fixed left fold, and the last
bits differ; a data-dependent program (MoE routing) would then take another path than in the capture. The
op still runs on the real transport (its timing is the real one); once it completes, its outputs are
overwritten with the captured values (read ahead of use by a helper thread).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch._C._distributed_c10d import Work

from prism import schemas
from prism import settings
from prism.runtime import semantics, shm, watchdog
from prism.runtime.capture.client import key_name
from prism.runtime.recorder import Recorder
from prism.runtime.transport import RealTransport, job_store, slice_store
from prism.runtime.work_parts import Forwarding

FIELDS = ("kind", "op", "group_name", "group_seq", "peer", "tag", "bytes")
_COMM = (schemas.KIND_COLLECTIVE, schemas.KIND_SEND, schemas.KIND_RECV)


class SliceDivergence(RuntimeError):
    """The slice rank issued another op than in the capture."""


def captured_ops(capture: Path, rank: int) -> list[tuple]:
    """The rank's communication ops in the capture, in program order: (kind, op, group, ..., bytes)."""
    path = Path(capture) / "raw" / f"rank={rank}" / "events.arrow"
    with pa.OSFile(str(path)) as source:
        table = ipc.open_stream(source).read_all()
    cols = {name: table[name].cast(pa.string()) if pa.types.is_dictionary(table[name].type) else table[name]
            for name in FIELDS + ("seq",)}
    rows = zip(*(cols[name].to_pylist() for name in FIELDS + ("seq",)))
    # a recv from any source is issued without a peer (the capture recorded whom it received from)
    return [r[:4] + (-1,) + r[5:] if r[1] == schemas.OP_RECV_ANYSOURCE else r for r in rows if r[0] in _COMM]


def _show(row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(FIELDS, row))


class SliceRecorder(Recorder):
    """A `Recorder` that stops the rank at its first op that differs from the capture."""

    def __init__(self, rank: int, out_dir: Path, capture: Path, device: str = "cpu") -> None:
        super().__init__(rank, out_dir, device=device)
        self._expected = captured_ops(capture, rank)
        self._next = 0

    def check(self, kind, op, group, group_seq, peer, tag, nbytes) -> None:
        """Before the op reaches the transport: a divergent op must not be sent to the replayed peers."""
        got = (kind, op, group, group_seq, peer, tag, nbytes)
        i = self._next
        self._next += 1
        want = self._expected[i] if i < len(self._expected) else None
        if want is None or tuple(want[:-1]) != got:
            where = (f"its op #{i} (seq {want[-1]} in the capture) is [{_show(got)}] here but "
                     f"[{_show(want[:-1])}] in the capture" if want is not None else
                     f"it issued [{_show(got)}] after the {len(self._expected)} ops of its capture")
            mode = settings.MODE.get() or "slice"
            raise SliceDivergence(
                f"prism {mode}: rank {self.rank} diverged from its capture: {where}. The {mode} run runs another "
                "program or arguments than the capture, or the program is nondeterministic; capture again "
                "with the same program")


# -- the capture's results of order-dependent reductions ---------------------------------------------------
_P2P = ("send", "recv", "recv_anysource")
# method -> the outputs among its arguments
_REDUCING = {
    "allreduce": lambda args: list(args[0]),
    "allreduce_coalesced": lambda args: list(args[0]),
    "reduce": lambda args: list(args[0]),
    "reduce_scatter": lambda args: list(args[0]),
    "reduce_scatter_single": lambda args: [args[0]],
}
READ_AHEAD = 8  # results loaded ahead of use


class CapturedResults:
    """This rank's captured results of order-dependent reductions, by communication key, read ahead in the
    rank's program order by one helper thread."""

    def __init__(self, capture: Path, rank: int) -> None:
        path = Path(capture) / "raw" / f"rank={rank}" / "payloads.arrow"
        with pa.OSFile(str(path)) as source:
            table = ipc.open_stream(source).read_all()
        rows = sorted((w, k, h) for w, k, r, h in zip(*(table[c].to_pylist() for c in
                                                        ("work_id", "key", "role", "hash"))) if r == "out")
        self._hash = {k: h for _, k, h in rows}
        self._order = [k for _, k, _ in rows]
        self._pos = {k: i for i, k in enumerate(self._order)}
        self._store = shm.PayloadStore(Path(capture) / "payloads")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prism-results") if rows else None
        self._loading: dict[str, Future] = {}
        self._next = 0  # first key of the order not yet submitted
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        return key in self._hash

    def take(self, key: str) -> Future:
        """The result of `key` (a future of its tensors); loads the next few ahead."""
        with self._lock:
            stop = min(len(self._order), self._pos[key] + READ_AHEAD + 1)
            self._next = max(self._next, self._pos[key])
            while self._next < stop:
                k = self._order[self._next]
                self._loading.setdefault(k, self._pool.submit(self._store.get, self._hash[k]))
                self._next += 1
            return self._loading.pop(key)


class _ResultWork(Forwarding, Work):
    """The real backend's work of a reduction; its outputs get the captured result when it completes."""

    def __init__(self, inner: Work, outputs: list[torch.Tensor], result: Future) -> None:
        super().__init__()
        self._inner, self._outputs, self._result = inner, outputs, result
        self._fixed = False

    def _fix(self) -> None:
        if self._fixed:
            return
        _, values = self._result.result()
        with torch.no_grad():
            for out, value in zip(self._outputs, values):
                semantics.write(out, value.view_as(out))
        self._fixed = True

    def wait(self, timeout=None) -> bool:
        self._inner.wait()
        self._fix()
        return True

    def get_future(self) -> torch.futures.Future:
        try:
            fut = self._inner.get_future()
        except RuntimeError:  # gloo's reduce_scatter has none
            from prism.runtime.backend import _future_by_waiting

            fut = _future_by_waiting(self._inner)

        def fixed(f):
            self._fix()
            return f.value()

        return fut.then(fixed)


class SliceTransport(RealTransport):
    """The real transport of a slice rank: order-dependent reductions return the capture's result."""

    def __init__(self, *args, results: CapturedResults, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._results = results
        self._seq = 0  # collectives issued on this group (the capture's key sequence)

    def call(self, method: str, device: torch.device, *args, work_id: int = -1, op: str = "") -> Work:
        work = super().call(method, device, *args, work_id=work_id, op=op)
        if method in _P2P:
            return work
        key = key_name(("c", self._group_name, self._seq))
        self._seq += 1
        if method in _REDUCING and key in self._results:
            return _ResultWork(work, _REDUCING[method](args), self._results.take(key))
        return work


_RESULTS: list[CapturedResults] = []  # this rank's, read once


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> SliceTransport:
    """Mode slice (`modes`): the real transport, in a key space the replay server (the virtual members) can
    reach, substituting the capture's results of the order-dependent reductions."""
    if not _RESULTS:
        _RESULTS.append(CapturedResults(Path(settings.CAPTURE.get()), int(os.environ.get("RANK", "0"))))
    transport = SliceTransport(slice_store(name, opts.store), opts.group_rank, opts.group_size, opts.timeout,
                               results=_RESULTS[0], want_nccl="nccl" in asked or asked == "undefined",
                               global_ranks=members, group_name=name)
    # the slice's ranks watch each other (`watchdog`: the real-mode rule over the ranks run for real)
    watchdog.start(job_store(opts.store), int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   ranks=settings.SLICE_RANKS.get() or None)
    return transport
