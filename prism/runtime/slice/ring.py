"""Mode `slice`: an all-reduce of a group with virtual members run as the N-member ring it is in the real job,
with the replay server playing only the slice ranks' ring neighbours (`PRISM_SLICE_RING=neighbours`).

Why: the replay server used to hold one gloo instance per virtual member, each running its own 2(N-1) ring
steps, so one process did (N-1) x 2(N-1) steps per all-reduce (docs/benchmarks.md, sessions 11-14: hours a
collective at N=2048, and 1.7-3.4x the job's ring at N=8-16 on one core). In a ring all-reduce a member only
talks to member-1 and member+1, so the rest need not run at all:

- every slice rank of the group runs the ring's own steps (N-1 reduce-scatter, N-1 all-gather; at each step it
  sends one chunk of S/N to the member on its right and receives one from the member on its left), over one
  small gloo group per group: the group's k slice ranks (in group-rank order) and the replay server (rank k);
- a right neighbour that is a slice rank gets the chunk directly; one that is virtual is the first member of a
  *run* of virtual members, which the server plays: it takes what the slice rank sends, and sends to the slice
  rank at the run's other end what the run's last member would send at that step (`sent_chunk`,
  `partial_positions`), paced as a ring: its step j+1 leaves once step j of the run's first slice rank arrived.

The server's work is 2(N-1) messages per run, O(S) bytes, not (N-1) x 2(N-1) ring steps, and a slice rank's
pattern is the N-ring's own (2(N-1) hops of S/N), not a collapsed 2-member ring (2 steps of S/2).

Values. A floating-point result is the capture's (`transport._ResultWork`, as for every reduction in a group of
more than two members), so what the server sends there only has to have the ring's sizes: it sends zeros. An
exact one (integers, booleans) must be right: the server reduces the recorded contributions of the positions
each sent chunk holds (the capture's payloads; a slice rank's own contribution is its capture's, which the
slice run checks it repeats), with the op's own reduction (`reduce_into`).

Which groups: the server decides (`neighbour_groups`, from the replay plan: groups of at least 3 members whose
every collective is an `all_reduce` and that carry no message with a virtual rank; on CPU tensors; the
setting on) and writes the answer into each group's store before any slice rank creates the group; a slice rank
reads it at group creation (`decision`). Every other group keeps one gloo instance per virtual member.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Work

from prism import settings
from prism.runtime import semantics
from prism.runtime.work_parts import OwnResult

DECISION_KEY = "ring"  # in the group's slice store: b"neighbours" or b"members"
# How many of a group's all-reduces a gloo group runs at once: its worker threads (torch's default options,
# 2). A real job's burst of async all-reduces (DDP's buckets) completes in pairs, two rings at a time
# (docs/fidelity.md, session 16); the neighbours ring runs as many at once on both sides.
GLOO_THREADS = ProcessGroupGloo._Options()._threads
MIN_MEMBERS = 3  # a 2-member group keeps today's path (its one gloo peer is the whole ring)
RING_OPS = ("all_reduce",)


class RingError(RuntimeError):
    """A collective the neighbours ring cannot carry (the message names it and the fix)."""


# -- the ring's schedule (the same arithmetic on both sides) ---------------------------------------------------
def steps(n: int) -> int:
    return 2 * (n - 1)


def sent_chunk(m: int, j: int, n: int) -> int:
    """The chunk member `m` sends its right neighbour at step `j`: reduce-scatter (j < n-1) sends chunk m-j,
    holding the partial reduction of members m-j..m; all-gather (k = j-(n-1)) sends the reduced chunk m+1-k."""
    return (m - j) % n if j < n - 1 else (m + 1 - (j - (n - 1))) % n


def received_chunk(m: int, j: int, n: int) -> int:
    """The chunk member `m` receives from its left neighbour at step `j` (what member m-1 sends)."""
    return sent_chunk((m - 1) % n, j, n)


def partial_positions(m: int, j: int, n: int) -> list[int]:
    """The members whose contributions the chunk member `m` sends at step `j` reduces (all of them in the
    all-gather)."""
    return [(m - i) % n for i in range(j + 1)] if j < n - 1 else list(range(n))


def chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The ring's n chunks of a flat tensor (the first ones one element longer; some empty when numel < n)."""
    return list(torch.tensor_split(flat, n))


def live_positions(members, slice_ranks) -> list[int]:
    """The ring positions (group ranks, sorted) of a group's slice ranks."""
    return [p for p, r in enumerate(members) if r in slice_ranks]


def runs(n: int, live: list[int]) -> list[tuple[int, int]]:
    """The runs of virtual members between the slice ranks at ring positions `live` (sorted): one (a, b) per
    slice rank a whose right neighbour is virtual, b the next slice rank to the right (b == a with one slice
    rank): the server takes a's chunks and sends b what member b-1 sends."""
    out = []
    for i, a in enumerate(live):
        b = live[(i + 1) % len(live)]
        if (a + 1) % n != b:
            out.append((a, b))
    return out


def reduce_into(dst: torch.Tensor, src: torch.Tensor, op) -> None:
    """dst <- dst (op) src, in place (`semantics.fold_into`); AVG is not a gloo all-reduce."""
    if op == semantics.RedOp.AVG:
        raise RingError("the neighbours ring cannot average (gloo has no AVG); set PRISM_SLICE_RING=members")
    semantics.fold_into(dst, src, op)


def exact(dtype: torch.dtype) -> bool:
    """A result the ring must compute (the capture keeps no result for it: `CaptureClient.keep_result`)."""
    return not (dtype.is_floating_point or dtype.is_complex)


# -- which groups ----------------------------------------------------------------------------------------------
def enabled() -> bool:
    """The setting asks for it and the job's tensors are on the CPU (on CUDA the members path is kept)."""
    ring = settings.SLICE_RING.get()
    if ring not in ("neighbours", "members"):
        raise RingError(f"{settings.SLICE_RING.name}={ring!r}: takes `neighbours` (the default) or `members`")
    return ring == "neighbours" and settings.DEVICE.get() != "cuda"


def neighbour_groups(plan) -> set[str]:
    """The groups of a replay plan (`replay.plan.ReplayPlan`) whose all-reduces run as neighbour rings."""
    if not enabled():
        return set()
    with_messages = {ch.group for ch in plan.channels}
    return {g for g in plan.order
            if len(plan.groups[g]) >= MIN_MEMBERS and plan.collectives[g] and g not in with_messages
            and all(c.op in RING_OPS for c in plan.collectives[g])}


def decision(store, timeout_s: float) -> bool:
    """A slice rank, at the creation of a group with a virtual member: does the server play it as neighbours?
    (The server writes the answer before it starts replaying.)"""
    store.wait([DECISION_KEY], timedelta(seconds=timeout_s))
    return store.get(DECISION_KEY) == b"neighbours"


def ring_group(store, rank: int, size: int, timeout) -> ProcessGroupGloo:
    """The small gloo group of a neighbours group: its slice ranks 0..k-1, the server k."""
    return ProcessGroupGloo(PrefixStore("ring/", store), rank, size, timeout)


# -- the slice rank's side -------------------------------------------------------------------------------------
class RingWork(OwnResult, Work):
    """A ring all-reduce in flight on the group's ring thread."""

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.inner = torch.futures.Future()
        self._result = outputs

    def wait(self, timeout=None) -> bool:
        self.inner.wait()  # (raises the ring thread's error)
        return True

    def get_future(self) -> torch.futures.Future:
        return self.inner

    def is_completed(self) -> bool:
        return self.inner.done()


class LiveRing:
    """A slice rank's all-reduces of one neighbours group: the N-ring's steps against its two neighbours (slice
    ranks directly, virtual ones through the server), in issue order, `GLOO_THREADS` of them at once (as gloo's
    worker threads run a group's ops; each op's messages carry its own tag)."""

    def __init__(self, store, members: list[int], slice_ranks: set[int], me: int, timeout, name: str) -> None:
        self.n = len(members)
        self.live = live_positions(members, slice_ranks)
        self.pos = members.index(me)
        self.index = {p: i for i, p in enumerate(self.live)}  # position -> rank in the ring group
        self.server = len(self.live)
        self.pg = ring_group(store, self.index[self.pos], len(self.live) + 1, timeout)
        self.name = name
        self.right = self._peer((self.pos + 1) % self.n)
        self.left = self._peer((self.pos - 1) % self.n)
        self.seq = 0
        self._thread = ThreadPoolExecutor(GLOO_THREADS, thread_name_prefix=f"prism-ring-g{name}")
        self._lock = threading.Lock()

    def _peer(self, position: int) -> int:
        return self.index.get(position, self.server)

    def allreduce(self, tensors: list[torch.Tensor], opts) -> RingWork:
        if len(tensors) != 1 or tensors[0].device.type != "cpu":
            raise RingError(f"group {self.name}: the neighbours ring carries one CPU tensor an all_reduce (got "
                            f"{len(tensors)} on {[t.device.type for t in tensors]}); set PRISM_SLICE_RING=members")
        t = tensors[0]
        with self._lock:
            tag = self.seq
            self.seq += 1
        work = RingWork([t])

        def run() -> None:
            try:
                self._ring(t, semantics.red_op(opts), tag)
                work.inner.set_result([t])
            except BaseException as exc:  # noqa: BLE001 - raised by the work's wait
                work.inner.set_exception(exc)

        self._thread.submit(run)
        return work

    def _ring(self, t: torch.Tensor, op, tag: int) -> None:
        flat = t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)
        ch = chunks(flat, self.n)
        m, n = self.pos, self.n
        for j in range(steps(n)):
            out, into = ch[sent_chunk(m, j, n)], ch[received_chunk(m, j, n)]
            tmp = torch.empty_like(into) if into.numel() else None
            r = self.pg.recv([tmp], self.left, tag) if tmp is not None else None
            s = self.pg.send([out], self.right, tag) if out.numel() else None
            if r is not None:
                r.wait()
                if j < n - 1:
                    reduce_into(into, tmp, op)
                else:
                    into.copy_(tmp)
            if s is not None:
                s.wait()
        if not t.is_contiguous():  # (a contiguous tensor was reduced in place through its view)
            t.copy_(flat.view_as(t))


# -- the server's side -----------------------------------------------------------------------------------------
def play(pg: ProcessGroupGloo, n: int, live: list[int], tag: int, template: torch.Tensor, op,
         contributions: dict[int, torch.Tensor] | None) -> int:
    """Play every run of virtual members of one all-reduce (see the module doc); returns the messages sent.

    `template`: a tensor of the all-reduce's shape and dtype (a slice rank's recorded contribution);
    `contributions`: every member's recorded contribution by ring position for an exact result, None for a
    floating-point one (zeros are sent)."""
    index = {p: i for i, p in enumerate(live)}
    flat_n = template.numel()
    proto = chunks(torch.empty(flat_n, dtype=template.dtype), n)
    parts = {p: chunks(c.reshape(-1), n) for p, c in contributions.items()} if contributions is not None else None
    zeros: dict[int, torch.Tensor] = {}
    sinks: dict[int, torch.Tensor] = {}

    def value(end: int, j: int) -> torch.Tensor:
        c = sent_chunk(end, j, n)
        size = proto[c].numel()
        if parts is None:
            if size not in zeros:
                zeros[size] = torch.zeros(size, dtype=template.dtype)
            return zeros[size]
        positions = partial_positions(end, j, n)
        acc = parts[positions[0]][c].clone()
        for p in positions[1:]:
            reduce_into(acc, parts[p][c], op)
        return acc

    def sink(size: int) -> torch.Tensor:
        if size not in sinks:
            sinks[size] = torch.empty(size, dtype=template.dtype)
        return sinks[size]

    plays = [(a, b, (b - 1) % n) for a, b in runs(n, live)]  # (slice rank before, after, the run's last)
    total = steps(n)
    if parts is not None:  # computed before the op is played, off its clock
        values = {(end, j): value(end, j) for _, _, end in plays for j in range(total)}
    else:
        values = None
    sent = []

    def send(end: int, b: int, j: int) -> None:
        v = values[(end, j)] if values is not None else value(end, j)
        if v.numel():
            sent.append(pg.send([v], index[b], tag))

    for _, b, end in plays:
        send(end, b, 0)
    for j in range(total):
        for a, b, end in plays:
            size = proto[sent_chunk(a, j, n)].numel()
            if size:
                pg.recv([sink(size)], index[a], tag).wait()
            if j + 1 < total:
                send(end, b, j + 1)
    for w in sent:
        w.wait()
    return len(sent)
