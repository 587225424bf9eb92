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
overwritten with the captured values.

Those results are loaded and checked (content hash) **before the program runs**, at the rank's first group:
a slice rank is pinned to one core and its compute is timed as its wall span, so a loader running beside the
program would be counted as the program's compute (docs/fidelity.md, session 10: dp8-var loads 6.3 MB per
rank-iteration, ~0.55 ms of CPU per 265 KB result). `PRISM_SLICE_PRELOAD_MB` bounds what one rank holds that
way; results past it are read ahead during the run by one helper thread on the rank's own core, with a warning.
Each rank writes what it loaded, when, and its threads' CPU time to `raw/rank=R/slice_results.json`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import types
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch._C._distributed_c10d import Work

from prism import job_paths, schemas
from prism import settings
from prism.runtime import semantics, shm, thread_cpu, watchdog
from prism.runtime.slice import ring
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
    path = job_paths.rank_stream(capture, rank)
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
        # each op as `check` receives it (without the capture's seq): the check on the program's path is one
        # tuple comparison (it runs before the op's span, so its cost lands in the rank's compute, which the
        # slices measure for the real job: 5.5 us an op with the slice made per call, 2 us a real rank's no-op)
        self._want = [tuple(w[:-1]) for w in self._expected]
        self._next = 0
        self.results: CapturedResults | None = None  # set by `for_group`

    def close(self) -> None:
        if self.results is not None and not self.closed:
            self.results.write_stats(self.dir)
        super().close()

    def check(self, kind, op, group, group_seq, peer, tag, nbytes) -> None:
        """Before the op reaches the transport: a divergent op must not be sent to the replayed peers."""
        got = (kind, op, group, group_seq, peer, tag, nbytes)
        i = self._next
        self._next = i + 1
        if i < len(self._want) and self._want[i] == got:
            return
        want = self._expected[i] if i < len(self._expected) else None
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
READ_AHEAD = 8  # results loaded ahead of use during the run (those past the preload bound)


class MissingResult(FileNotFoundError):
    """A captured result's payload file is missing (the message names it and the fix)."""


class CapturedResults:
    """This rank's captured results of order-dependent reductions, by communication key: the first ones in the
    rank's program order, up to `preload_bytes` of payload files, loaded and checked by `preload()` (before the
    program runs); the rest read ahead of use by one helper thread."""

    def __init__(self, capture: Path, rank: int, preload_bytes: int = 0) -> None:
        path = job_paths.rank_stream(capture, rank, "payloads.arrow")
        with pa.OSFile(str(path)) as source:
            table = ipc.open_stream(source).read_all()
        rows = sorted((w, k, h) for w, k, r, h in zip(*(table[c].to_pylist() for c in
                                                        ("work_id", "key", "role", "hash"))) if r == "out")
        self.rank = rank
        self._hash = {k: h for _, k, h in rows}
        self._order = [k for _, k, _ in rows]
        self._pos = {k: i for i, k in enumerate(self._order)}
        self._seqs: dict[str, frozenset[int]] | None = None  # (collective_seqs)
        self._store = shm.PayloadStore(job_paths.payloads_dir(capture))
        self._preload_bytes = max(0, int(preload_bytes))
        self._pool: ThreadPoolExecutor | None = None  # started only for results past the preload
        self._loading: dict[str, Future] = {}
        self._next = 0  # first key of the order not yet submitted
        self._size: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stats = dict(results=len(rows), bytes=0, preload_limit_bytes=self._preload_bytes, preloaded=0,
                          preloaded_bytes=0, preload_wall_s=0.0, preload_cpu_s=0.0, during_run=0,
                          during_run_bytes=0, during_run_cpu_s=0.0)

    def __contains__(self, key: str) -> bool:
        return key in self._hash

    def collective_seqs(self, group_name: str) -> frozenset[int]:
        """The per-group sequence numbers of `group_name`'s collectives that have a captured result (their keys
        are `key_name(("c", group_name, seq))`): a group's op looks its number up instead of naming its key."""
        if self._seqs is None:
            by_head: dict[str, set[int]] = {}
            for key in self._hash:
                head, _, tail = key.rpartition("-")
                if head.startswith("c-") and tail.isdigit():
                    by_head.setdefault(head, set()).add(int(tail))
            self._seqs = {h: frozenset(v) for h, v in by_head.items()}
        return self._seqs.get(key_name(("c", group_name)), frozenset())

    def _file(self, key: str) -> Path:
        h = self._hash[key]
        return self._store.dir / h[:2] / f"{h}.bin"

    def preload(self) -> None:
        """Load and check the results in program order while their files fit `preload_bytes` (in the caller's
        thread: before the program runs). Raises `shm.CorruptPayload` naming a damaged file."""
        sizes = []
        for k in self._order:
            try:
                sizes.append(os.path.getsize(self._file(k)))
            except FileNotFoundError:
                raise MissingResult(
                    f"{self._file(k)}: missing: the capture's result of {k} (rank {self.rank}) is not among its "
                    "payloads; the capture's payloads are incomplete: capture again (re-run the capture stage, or "
                    "`prism launch --mode capture --out CAPDIR ...`)") from None
        self._size = dict(zip(self._order, sizes))
        self.stats["bytes"] = sum(sizes)
        t0, c0, held = time.perf_counter(), time.thread_time(), 0
        for k, size in zip(self._order, sizes):
            if held + size > self._preload_bytes:
                break
            done: Future = Future()
            done.set_result(self._store.get(self._hash[k]))
            self._loading[k] = done
            held += size
            self._next += 1
        self.stats.update(rank_cores=sorted(os.sched_getaffinity(0)), preloaded=self._next, preloaded_bytes=held,
                          preload_wall_s=time.perf_counter() - t0, preload_cpu_s=time.thread_time() - c0)
        if self._next < len(self._order):
            print(f"[prism] slice rank {self.rank}: {len(self._order) - self._next} of {len(self._order)} captured "
                  f"results ({(self.stats['bytes'] - held) / 1e6:.1f} MB) are past PRISM_SLICE_PRELOAD_MB="
                  f"{self._preload_bytes / 1e6:.0f} and are loaded during the run on the rank's own core, which "
                  "its compute times then include; raise PRISM_SLICE_PRELOAD_MB (memory allowing) to load them all "
                  "before the run", file=sys.stderr)

    def _load_during_run(self, key: str):
        c0 = time.thread_time()
        out = self._store.get(self._hash[key])
        with self._lock:
            self.stats["during_run"] += 1
            self.stats["during_run_bytes"] += self._size.get(key, 0)
            self.stats["during_run_cpu_s"] += time.thread_time() - c0
            self.stats["loader_cores"] = sorted(os.sched_getaffinity(0))  # this thread's: the rank's own core
        return out

    def take(self, key: str) -> Future:
        """The result of `key` (a future of its tensors); past the preloaded ones, loads the next few ahead."""
        with self._lock:
            stop = min(len(self._order), self._pos[key] + READ_AHEAD + 1)
            self._next = max(self._next, self._pos[key])
            while self._next < stop:
                k = self._order[self._next]
                if k not in self._loading:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prism-results")
                    self._loading[k] = self._pool.submit(self._load_during_run, k)
                self._next += 1
            return self._loading.pop(key)

    def write_stats(self, folder: Path) -> None:
        """`slice_results.json` in the rank's raw folder: what was loaded before / during the run, and the CPU
        time of each of the rank's threads (`thread_cpu.by_thread`) and their time runnable but waiting for a
        CPU (`thread_cpu.runq_wait_by_thread`) at its end."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "slice_results.json.tmp"
        tmp.write_text(json.dumps(dict(self.stats, threads_cpu_s=thread_cpu.by_thread(),
                                       threads_runq_wait_s=thread_cpu.runq_wait_by_thread()), indent=1) + "\n")
        os.replace(tmp, folder / "slice_results.json")


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
    """The real transport of a slice rank: order-dependent reductions return the capture's result.

    A group with a virtual member carries CUDA tensors over gloo, whatever the program asked for: the replay
    server's members are gloo instances (`replay_server`), so an NCCL communicator would wait for ever for
    members that never join it (torchtitan's "nccl" default group on the H200, session 12: the slice ranks sat
    in NCCL's initialisation inside their first CUDA collective, the server's gloo ops had no partner; the
    reference workload's CUDA tests ask for gloo and passed). gloo copies the CUDA tensors across, as the
    replay server's own members do. A group of slice ranks only keeps the backend the program asked for, unless
    two of its members use one CUDA device: NCCL refuses two ranks on one device, and a slice places several
    logical ranks on one GPU (W=8 FSDP2 4 x TP 2 on one H200: each slice is a whole TP pair); such a group
    carries CUDA tensors over gloo too (`shares_a_device`). gloo moves no float8: the group's ops hand it float8
    data as uint8 (`FLOAT8_AS_BYTES`, read by the interception: `PrismProcessGroup` views the op's arguments)."""

    FLOAT8_AS_BYTES = True

    def __init__(self, store, group_rank: int, group_size: int, timeout, *, results: CapturedResults,
                 global_ranks: list[int], **kwargs) -> None:
        slice_ranks = set(settings.SLICE_RANKS.get())
        replayed = bool(slice_ranks) and not slice_ranks.issuperset(global_ranks)
        # a group whose virtual members the server plays as ring neighbours (`ring`) has no gloo instance of
        # its N members: its all-reduces run the ring's steps over a small group with the server
        self._ring = None
        wait = timeout or timedelta(minutes=30)  # (RealTransport's default)
        if replayed and group_size >= ring.MIN_MEMBERS and ring.decision(store, wait.total_seconds()):
            self._ring = ring.LiveRing(store, list(global_ranks), slice_ranks, int(os.environ.get("RANK", "0")),
                                       wait, kwargs.get("group_name", "?"))
        super().__init__(store, group_rank, group_size, timeout, global_ranks=global_ranks, **kwargs)
        if replayed:
            self._want_nccl = False  # a replayed member: gloo (above)
        self._devices_checked = False
        self._results = results
        self._seq = 0  # collectives issued on this group (the capture's key sequence)
        # the group's seqs whose result the capture kept
        self._with_result = results.collective_seqs(self._group_name) if results is not None else frozenset()
        if self._ring is None and not self._with_result:
            # nothing to substitute: the group's ops take a real rank's path itself (`RealTransport.call`), the
            # slice's issue spans being the real job's measurement (docs/fidelity.md, session 17)
            self.call = types.MethodType(RealTransport.call, self)

    def _gloo(self):
        if self._ring is not None:
            return None  # (no N-member instance: every op of the group is a ring all-reduce)
        return super()._gloo()

    def start_coalescing(self, device: torch.device) -> None:
        if self._ring is None:
            super().start_coalescing(device)

    def end_coalescing(self, device: torch.device) -> Work | None:
        return None if self._ring is not None else super().end_coalescing(device)

    def backend_for(self, device: torch.device):
        if device.type == "cuda" and self._want_nccl and not self._devices_checked:
            self._devices_checked = True
            if self.shares_a_device(device):
                self._want_nccl = False
        return super().backend_for(device)

    def shares_a_device(self, device: torch.device) -> bool:
        """Do two members of the group use one CUDA device? Each member publishes its device's identity in the
        group's store at its first CUDA op on the group (made before NCCL would be: every member of an NCCL
        communicator joins it there too) and reads the others'; every member sees the same answer."""
        self._store.set(f"cuda_device/{self._rank}", cuda_device_id(device))
        ids = [self._store.get(f"cuda_device/{r}").decode() for r in range(self._size)]
        return len(set(ids)) < len(ids)

    def call(self, method: str, device: torch.device, *args, work_id: int = -1, op: str = "") -> Work:
        if self._ring is not None:
            return self._ring_call(method, *args)
        work = RealTransport.call(self, method, device, *args)  # (a real rank's path, then the substitution)
        if method in _P2P:
            return work
        seq = self._seq
        self._seq = seq + 1
        if seq in self._with_result and method in _REDUCING:
            return _ResultWork(work, _REDUCING[method](args), self._results.take(key_name(("c", self._group_name, seq))))
        return work

    def _ring_call(self, method: str, *args) -> Work:
        key = key_name(("c", self._group_name, self._seq))
        self._seq += 1
        if method != "allreduce":  # (the slice recorder stops an op the capture did not have before this)
            raise ring.RingError(f"group {self._group_name}: {method} on a neighbours-ring group, whose captured "
                                 "collectives are all all_reduce; set PRISM_SLICE_RING=members")
        tensors, opts = args
        floating = any(not ring.exact(t.dtype) for t in tensors)
        if floating and key not in self._results:
            raise ring.RingError(f"group {self._group_name}: the capture kept no result of {key} (a floating-point "
                                 "all_reduce), which the neighbours ring needs; capture again with payloads, or set "
                                 "PRISM_SLICE_RING=members")
        work = self._ring.allreduce(tensors, opts)
        return _ResultWork(work, list(tensors), self._results.take(key)) if floating else work


def cuda_device_id(device: torch.device) -> str:
    """The physical CUDA device behind `device` in this process (host and device UUID: the same GPU under
    another CUDA_VISIBLE_DEVICES order gives the same id)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(index).uuid}"


_RESULTS: list[CapturedResults] = []  # this rank's, read once


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> SliceTransport:
    """Mode slice (`modes`): the real transport, in a key space the replay server (the virtual members) can
    reach, substituting the capture's results of the order-dependent reductions."""
    if not _RESULTS:
        bound = settings.SLICE_PRELOAD_MB.get()
        if bound < 0:
            raise ValueError(f"{settings.SLICE_PRELOAD_MB.name}={bound:g} is negative: it takes the MB of captured "
                             "results a slice rank may load before the run (0: none, all during the run)")
        results = CapturedResults(Path(settings.CAPTURE.get()), int(os.environ.get("RANK", "0")),
                                  preload_bytes=int(bound * 1e6))
        results.preload()
        _RESULTS.append(results)
        if rec is not None:
            rec.resync()  # the loading is before the program's first event, no one's compute
            if isinstance(rec, SliceRecorder):
                rec.results = results  # its numbers are written beside the rank's trace at the end
    transport = SliceTransport(slice_store(name, opts.store), opts.group_rank, opts.group_size, opts.timeout,
                               results=_RESULTS[0], want_nccl="nccl" in asked or asked == "undefined",
                               global_ranks=members, group_name=name)
    # the slice's ranks watch each other (`watchdog`: the real-mode rule over the ranks run for real)
    watchdog.start(job_store(opts.store), int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   ranks=settings.SLICE_RANKS.get() or None)
    return transport
