"""The global-clock sweep: numba kernels, linear in the number of events.

Semantics (the same as `prism.calibrate.reference`, which tests hold these kernels to, bit for bit):
every rank's clock starts at 0; an event starts when its rank's previous event ended; a PLAIN event or an
op ends at start + duration; a comm's completion is (last member's issue start) + transfer for a
collective, max(recv issue, send issue + transfer) for a send/recv pair; a wait on a collective or a
recv ends at max(start + own duration, completion); a wait on a send is local; ops without a wait never
block. All times are int64 ns.

Two passes:

- `discover`: a worklist over *bundles*; a bundle runs until a wait whose comm is incomplete, then parks
  on that comm and is woken when its last member arrives. The order is recorded as segments
  (bundle, first step, number of steps). It also returns the first timeline.
- `Schedule.replay`: the same computation with new durations in the recorded order: no worklist, no
  checks, a linear pass over arrays laid out in that order (`Schedule.to_schedule`).

A bundle is a set of ranks with identical code sequences (`arrays.prepare`) that share collectives,
e.g. a TP group, or a whole pipeline stage of identical DP replicas: they advance in lockstep, one step
(one event per lane) at a time, so the per-event branch on the code is paid once per step and the lane
loops vectorize. Lockstep can only delay a lane, never change a time (every event's time depends only on
its own dependencies), so the result is exact; it can, on an unusual graph, block a bundle that would
progress rank by rank: discover then splits the bundles that blocked into single ranks and sweeps again.
Single ranks that block are a real dependency cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from prism.calibrate.arrays import (
    ARRIVE,
    K_RECV,
    PLAIN,
    WAIT,
    SweepError,
    SweepGraph,
    check_durations,
    prepare,
)
from prism.calibrate.bundles import bundles, split

NEG = -(2**62)  # "no arrival yet"; far from int64's limits so that adding a transfer cannot wrap


# ------------------------------------------------------------------------------------------ discover


@njit(cache=True)
def _discover(code, link, dur, xfer, need, lane_ptr, lane_base, nsteps, max_segments, n_steps, n_comm_events,
              end, acc):
    """The worklist sweep; fills `end` (event order) and `acc` (max arrival per comm).

    It also lays out what a replay reads, in the order it runs the steps: a code per step, and the comm
    of every comm event, renumbered by first use (so that a replay reads its per-comm arrays almost in
    order; ``order[i]`` is the original id of schedule comm i).

    Returns (segments, their bundle, first step, steps, bundles finished, cursor per bundle, comm each
    bundle is parked on (-1: none), step codes, step comms, comm order).
    """
    nb = len(lane_ptr) - 1
    m = len(need)
    clock = np.zeros(len(lane_base), dtype=np.int64)
    arrived = np.zeros(m, dtype=np.int64)
    park_head = np.full(m, -1, dtype=np.int64)
    park_next = np.full(nb, -1, dtype=np.int64)
    parked_on = np.full(nb, -1, dtype=np.int64)
    cursor = np.zeros(nb, dtype=np.int64)
    check = np.zeros(nb, dtype=np.int64)
    stack = np.empty(nb, dtype=np.int64)
    seg_b = np.empty(max_segments, dtype=np.int64)
    seg_lo = np.empty(max_segments, dtype=np.int64)
    seg_n = np.empty(max_segments, dtype=np.int64)
    step_code = np.empty(n_steps, dtype=np.uint8)
    cid = np.empty(n_comm_events, dtype=np.int32)
    renum = np.full(m, -1, dtype=np.int32)
    order = np.empty(m, dtype=np.int64)
    nc = 0
    kp = 0
    cp = 0
    sp = 0
    for b in range(nb - 1, -1, -1):
        stack[sp] = b
        sp += 1
    ns = 0
    finished = 0
    while sp > 0:
        sp -= 1
        b = stack[sp]
        l0 = lane_ptr[b]
        l1 = lane_ptr[b + 1]
        base0 = lane_base[l0]
        st = cursor[b]
        lo = st
        n_st = nsteps[b]
        parked_on[b] = -1
        while st < n_st:
            cd = code[base0 + st]
            if cd == PLAIN:
                for l in range(l0, l1):
                    e = lane_base[l] + st
                    t = clock[l] + dur[e]
                    clock[l] = t
                    end[e] = t
            elif cd == ARRIVE:
                for l in range(l0, l1):
                    e = lane_base[l] + st
                    c = link[e]
                    t = clock[l]
                    a = acc[c]
                    acc[c] = t if t > a else a
                    arrived[c] += 1
                    if arrived[c] == need[c]:
                        q = park_head[c]
                        while q >= 0:
                            nxt = park_next[q]
                            stack[sp] = q
                            sp += 1
                            q = nxt
                        park_head[c] = -1
                    t += dur[e]
                    clock[l] = t
                    end[e] = t
            else:
                blocked = -1
                for l in range(l0 + check[b], l1):
                    c = link[lane_base[l] + st]
                    if arrived[c] < need[c]:
                        blocked = c
                        check[b] = l - l0
                        break
                if blocked >= 0:
                    park_next[b] = park_head[blocked]
                    park_head[blocked] = b
                    parked_on[b] = blocked
                    break
                check[b] = 0
                for l in range(l0, l1):
                    e = lane_base[l] + st
                    c = link[e]
                    r = acc[c] + xfer[c]
                    t = clock[l] + dur[e]
                    if r > t:
                        t = r
                    clock[l] = t
                    end[e] = t
            step_code[kp] = cd
            kp += 1
            if cd != PLAIN:
                for l in range(l0, l1):
                    c = link[lane_base[l] + st]
                    if renum[c] < 0:
                        renum[c] = nc
                        order[nc] = c
                        nc += 1
                    cid[cp] = renum[c]
                    cp += 1
            st += 1
        if st > lo:
            seg_b[ns] = b
            seg_lo[ns] = lo
            seg_n[ns] = st - lo
            ns += 1
        cursor[b] = st
        if st == n_st:
            finished += 1
    return ns, seg_b, seg_lo, seg_n, finished, cursor, parked_on, step_code, cid, order[:nc]


@njit(cache=True)
def _max_segments(code, lane_ptr, lane_base, nsteps):
    """Upper bound on the segments: each one but a bundle's last ends by parking at a distinct wait step."""
    total = 0
    for b in range(len(lane_ptr) - 1):
        base = lane_base[lane_ptr[b]]
        total += 1
        for k in range(nsteps[b]):
            if code[base + k] == WAIT:
                total += 1
    return total


# ---------------------------------------------------------------------------------- schedule layout


# The layout's transpositions (rank-major <-> lockstep steps) move blocks of lanes x steps: each lane's
# run of steps is contiguous on the rank-major side, each step's run of lanes on the schedule side.
_TILE_LANES = 16
_TILE_STEPS = 32


@njit(cache=True)
def _gather(seg_b, seg_lo, seg_n, lane_ptr, lane_base, x, out):
    """out (schedule order) <- x (event order)."""
    pos = 0
    for s in range(len(seg_b)):
        b = seg_b[s]
        l0 = lane_ptr[b]
        g = lane_ptr[b + 1] - l0
        lo = seg_lo[s]
        n = seg_n[s]
        for k0 in range(0, n, _TILE_STEPS):
            k1 = min(n, k0 + _TILE_STEPS)
            for t0 in range(0, g, _TILE_LANES):
                for l in range(t0, min(g, t0 + _TILE_LANES)):
                    src = lane_base[l0 + l] + lo
                    for k in range(k0, k1):
                        out[pos + k * g + l] = x[src + k]
        pos += n * g


@njit(cache=True)
def _scatter(seg_b, seg_lo, seg_n, lane_ptr, lane_base, nsteps, xs, out, start):
    """out (event order) <- xs (schedule order); with `start` (len > 0), also start[e + 1] = out[e]
    within a rank and 0 at a rank's first event: the timeline's starts in the same pass."""
    with_start = len(start) > 0
    pos = 0
    for s in range(len(seg_b)):
        b = seg_b[s]
        l0 = lane_ptr[b]
        g = lane_ptr[b + 1] - l0
        lo = seg_lo[s]
        n = seg_n[s]
        last = nsteps[b] - 1
        for k0 in range(0, n, _TILE_STEPS):
            k1 = min(n, k0 + _TILE_STEPS)
            for t0 in range(0, g, _TILE_LANES):
                for l in range(t0, min(g, t0 + _TILE_LANES)):
                    dst = lane_base[l0 + l] + lo
                    for k in range(k0, k1):
                        v = xs[pos + k * g + l]
                        out[dst + k] = v
                        if with_start:
                            if lo + k < last:
                                start[dst + k + 1] = v
                            if lo + k == 0:
                                start[dst] = 0
        pos += n * g


# ------------------------------------------------------------------------------------------- replay


@njit(cache=True)
def _replay(seg_b, seg_n, lane_ptr, step_code, cid, dur_s, xfer_s, clock, acc, end_s):
    """The sweep in the recorded order over schedule-ordered arrays: `end_s` <- end times, `acc` <- arrivals.

    `cid`, `xfer_s` and `acc` use the schedule's comm numbering. The max on arrival is a select, not a
    branch: which member arrives last is random, a branch on it mispredicts.
    """
    pos = 0
    sp = 0
    cp = 0
    for s in range(len(seg_b)):
        b = seg_b[s]
        l0 = lane_ptr[b]
        g = lane_ptr[b + 1] - l0
        for _ in range(seg_n[s]):
            cd = step_code[sp]
            sp += 1
            if cd == PLAIN:
                for l in range(g):
                    t = clock[l0 + l] + dur_s[pos + l]
                    clock[l0 + l] = t
                    end_s[pos + l] = t
            elif cd == ARRIVE:
                for l in range(g):
                    c = cid[cp + l]
                    t = clock[l0 + l]
                    a = acc[c]
                    acc[c] = t if t > a else a
                    t += dur_s[pos + l]
                    clock[l0 + l] = t
                    end_s[pos + l] = t
                cp += g
            else:
                for l in range(g):
                    c = cid[cp + l]
                    r = acc[c] + xfer_s[c]
                    t = clock[l0 + l] + dur_s[pos + l]
                    if r > t:
                        t = r
                    clock[l0 + l] = t
                    end_s[pos + l] = t
                cp += g
            pos += g


# ------------------------------------------------------------------------------------------- results


@dataclass(eq=False)
class Timeline:
    """One global clock: every event's start and end, every comm's start (last arrival) and completion."""

    start_ns: np.ndarray  # int64[n], event order
    end_ns: np.ndarray  # int64[n]
    comm_start_ns: np.ndarray  # int64[m]: last member's issue start (p2p: later of send and recv issue)
    comm_end_ns: np.ndarray  # int64[m]: completion

    @classmethod
    def empty(cls, n_events: int, n_comms: int) -> "Timeline":
        return cls(*(np.empty(k, dtype=np.int64) for k in (n_events, n_events, n_comms, n_comms)))


@njit(cache=True)
def _starts(rank_ptr, end, start):
    """Each event starts when its rank's previous event ended; a rank's first event at 0."""
    for r in range(len(rank_ptr) - 1):
        lo = rank_ptr[r]
        hi = rank_ptr[r + 1]
        if hi > lo:
            start[lo] = 0
            for e in range(lo + 1, hi):
                start[e] = end[e - 1]


@njit(cache=True)
def _comm_times(acc, xfer, order, p2p, recv_of, start, comm_start, comm_end):
    """Comm `order[i]` from its max arrival `acc[i]` and transfer `xfer[i]` (i: the caller's numbering).

    A collective starts at its last arrival and completes a transfer later; a send/recv pair starts at
    the later of the two issues and completes at max(recv issue, send issue + transfer).
    """
    for i in range(len(order)):
        c = order[i]
        a = acc[i]
        done = a + xfer[i]
        if p2p[c]:
            r = start[recv_of[c]]
            comm_start[c] = a if a > r else r
            comm_end[c] = done if done > r else r
        else:
            comm_start[c] = a
            comm_end[c] = done


def _finish(sched: "Schedule", end: np.ndarray, acc: np.ndarray, xfer: np.ndarray) -> Timeline:
    """The discover sweep's timeline: starts derived from `end`, comm times from the arrivals."""
    out = Timeline(np.empty_like(end), end, np.empty_like(acc), np.empty_like(acc))
    _starts(sched.graph.rank_ptr, end, out.start_ns)
    _comm_times(acc, xfer, np.arange(len(acc)), sched.graph.comm_p2p, sched.recv_of, out.start_ns,
                out.comm_start_ns, out.comm_end_ns)
    return out


@dataclass(eq=False)
class Schedule:
    """The order `discover` recorded, and what a replay needs to follow it.

    Repeated sweeps: `replay` takes event-ordered durations and transfers, lays them out in schedule
    order, runs the kernel and writes the timeline (into `out` when given); its scratch buffers are kept
    between calls, so a loop of replays allocates nothing. `replay_scheduled` is the kernel alone, for
    callers that produce their durations directly in schedule order.
    """

    graph: SweepGraph
    lane_ptr: np.ndarray  # int64[B+1]
    lane_rank: np.ndarray  # int64[W]
    lane_base: np.ndarray  # int64[W]: first event of each lane's rank
    seg_bundle: np.ndarray  # int64[S]
    seg_first: np.ndarray  # int64[S]: first step (seq) of the segment
    seg_steps: np.ndarray  # int64[S]
    bundle_steps: np.ndarray  # int64[B]: events per rank of each bundle
    step_code: np.ndarray  # uint8[total steps], schedule order
    step_comm: np.ndarray  # int32[comm events], schedule order, schedule comm numbering
    comm_order: np.ndarray  # int64[m]: original comm id of schedule comm i
    recv_of: np.ndarray  # int64[m]: a p2p comm's recv event (-1 for collectives)
    bundled: bool  # some bundle has several ranks
    _scratch: dict = field(default_factory=dict, repr=False)

    @property
    def n_bundles(self) -> int:
        return len(self.lane_ptr) - 1

    @property
    def nbytes(self) -> int:
        """Memory the schedule holds (not counting the graph), scratch buffers included."""
        arrays = (self.lane_ptr, self.lane_rank, self.lane_base, self.seg_bundle, self.seg_first,
                  self.seg_steps, self.bundle_steps, self.step_code, self.step_comm, self.comm_order, self.recv_of,
                  *self._scratch.values())
        return sum(a.nbytes for a in arrays)

    def _segments(self):
        return self.seg_bundle, self.seg_first, self.seg_steps, self.lane_ptr, self.lane_base

    def _buffer(self, name: str, size: int) -> np.ndarray:
        buf = self._scratch.get(name)
        if buf is None:
            buf = self._scratch[name] = np.empty(size, dtype=np.int64)
        return buf

    def to_schedule(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Per-event values (event order) laid out in schedule order, for `replay_scheduled`."""
        values = np.ascontiguousarray(values, dtype=np.int64)
        out = np.empty(self.graph.n_events, dtype=np.int64) if out is None else out
        _gather(*self._segments(), values, out)
        return out

    def from_schedule(self, values_s: np.ndarray, out: np.ndarray | None = None,
                      start: np.ndarray | None = None) -> np.ndarray:
        """Schedule-ordered per-event values back in event order (into `out`).

        With `start`, the values are end times and `start` receives each event's start (its rank's
        previous end, 0 first) in the same pass.
        """
        out = np.empty(self.graph.n_events, dtype=np.int64) if out is None else out
        start = np.empty(0, dtype=np.int64) if start is None else start
        _scatter(*self._segments(), self.bundle_steps, values_s, out, start)
        return out

    def transfer_to_schedule(self, transfer: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Per-comm transfers (original ids) in the schedule's comm numbering."""
        return np.take(np.ascontiguousarray(transfer, dtype=np.int64), self.comm_order, out=out)

    def replay_scheduled(
        self, durations_s: np.ndarray, transfer_s: np.ndarray, out: np.ndarray | None = None,
        acc: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The replay kernel alone, all in schedule order: (end times, max arrival per schedule comm).

        `out` (int64[n]) and `acc` (int64[m]) are reused when given: repeated sweeps need no new memory.
        """
        clock = np.zeros(len(self.lane_rank), dtype=np.int64)
        acc = np.empty(self.graph.n_comms, dtype=np.int64) if acc is None else acc
        acc.fill(NEG)
        end_s = np.empty(self.graph.n_events, dtype=np.int64) if out is None else out
        _replay(self.seg_bundle, self.seg_steps, self.lane_ptr, self.step_code, self.step_comm,
                durations_s, transfer_s, clock, acc, end_s)
        return end_s, acc

    def replay(self, durations: np.ndarray, transfer: np.ndarray, out: Timeline | None = None) -> Timeline:
        """The timeline for new durations (event order) and transfers, in the recorded order."""
        durations, transfer = check_durations(self.graph, durations, transfer)
        n, m = self.graph.n_events, self.graph.n_comms
        dur_s = self.to_schedule(durations, out=self._buffer("durations", n))
        xfer_s = self.transfer_to_schedule(transfer, out=self._buffer("transfer", m))
        end_s, acc = self.replay_scheduled(dur_s, xfer_s, out=self._buffer("end", n), acc=self._buffer("acc", m))
        out = Timeline.empty(n, m) if out is None else out
        self.from_schedule(end_s, out=out.end_ns, start=out.start_ns)
        _comm_times(acc, xfer_s, self.comm_order, self.graph.comm_p2p, self.recv_of, out.start_ns,
                    out.comm_start_ns, out.comm_end_ns)
        return out


def discover(
    graph: SweepGraph,
    durations: np.ndarray,
    transfer: np.ndarray,
    bundle: bool = True,
) -> tuple[Schedule, Timeline]:
    """The first sweep: checks the graph, finds the order, returns it with the timeline.

    `bundle=False` runs one rank per bundle. Raises `SweepError` on an inconsistent graph (unmatched
    comm, wait on no op, ...) or a dependency cycle, naming the ranks and events involved.
    """
    code, link, need = prepare(graph)
    durations, transfer = check_durations(graph, durations, transfer)
    n_comm_events = int(np.count_nonzero(code != PLAIN))
    lane_ptr, lane_rank = bundles(graph, code, link, bundle)
    while True:
        lane_base = graph.rank_ptr[lane_rank].astype(np.int64)
        nsteps = np.diff(graph.rank_ptr)[lane_rank[lane_ptr[:-1]]].astype(np.int64)
        max_seg = _max_segments(code, lane_ptr, lane_base, nsteps)
        end = np.empty(graph.n_events, dtype=np.int64)
        acc = np.full(graph.n_comms, NEG, dtype=np.int64)
        ns, seg_b, seg_lo, seg_n, finished, cursor, parked_on, step_code, step_comm, comm_order = _discover(
            code, link, durations, transfer, need, lane_ptr, lane_base, nsteps, max_seg,
            int(nsteps.sum()), n_comm_events, end, acc,
        )
        if finished == len(lane_ptr) - 1:
            break
        size = np.diff(lane_ptr)
        if np.any((cursor < nsteps) & (size > 1)):  # lockstep may be what blocked: split, sweep again
            culprits = _lockstep_culprits(graph, code, link, lane_ptr, lane_rank, cursor, nsteps, parked_on)
            ranks = np.concatenate([lane_rank[lane_ptr[b] : lane_ptr[b + 1]] for b in culprits])
            lane_ptr, lane_rank = split(lane_ptr, lane_rank, ranks)
            continue
        # only single ranks are blocked: a real cycle among them
        next_event = np.zeros(graph.n_ranks, dtype=np.int64)
        parked = np.full(graph.n_ranks, -1, dtype=np.int64)
        single = np.flatnonzero(size == 1)
        next_event[lane_rank[lane_ptr[single]]] = lane_base[lane_ptr[single]] + cursor[single]
        parked[lane_rank[lane_ptr[single]]] = parked_on[single]
        _raise_stuck(graph, code, link, next_event, parked)
    seg_b, seg_lo, seg_n = seg_b[:ns].copy(), seg_lo[:ns].copy(), seg_n[:ns].copy()
    recv_events = np.flatnonzero(graph.kind == K_RECV)
    recv_of = np.full(graph.n_comms, -1, dtype=np.int64)
    recv_of[graph.comm[recv_events]] = recv_events
    sched = Schedule(
        graph, lane_ptr, lane_rank, lane_base, seg_b, seg_lo, seg_n, nsteps, step_code, step_comm, comm_order,
        recv_of, len(lane_ptr) - 1 < graph.n_ranks,
    )
    return sched, _finish(sched, end, acc, transfer)


def _lockstep_culprits(graph, code, link, lane_ptr, lane_rank, cursor, nsteps, parked_on) -> list[int]:
    """The multi-rank bundles to split after a blocked discover.

    Every unfinished bundle is parked on a comm; it waits for the bundles of that comm's members that
    have not issued it yet. A multi-rank bundle on a cycle of these waits (a self-loop included: one lane
    waiting for a later step of another) may be blocked by lockstep alone: split those. Bundles that only
    wait for a cycle stay whole. When the cycles hold single ranks only, split every unfinished bundle, so
    that the next sweep stops with the whole state rank by rank, to report the cycle.
    """
    n_bundles = len(lane_ptr) - 1
    bundle_of = np.empty(graph.n_ranks, dtype=np.int64)
    bundle_of[lane_rank] = np.repeat(np.arange(n_bundles), np.diff(lane_ptr))
    arrivals = np.flatnonzero(code == ARRIVE)
    by_comm = arrivals[np.argsort(link[arrivals], kind="stable")]
    comm_ptr = np.searchsorted(link[by_comm], np.arange(graph.n_comms + 1))
    rank_of = np.searchsorted(graph.rank_ptr, by_comm, side="right") - 1
    seq_of = by_comm - graph.rank_ptr[rank_of]
    unfinished = np.flatnonzero(cursor < nsteps)
    waits_for: dict[int, set[int]] = {}
    for b in unfinished.tolist():
        c = parked_on[b]
        lo, hi = comm_ptr[c], comm_ptr[c + 1]
        owners = bundle_of[rank_of[lo:hi]]
        missing = seq_of[lo:hi] >= cursor[owners]
        waits_for[b] = set(owners[missing].tolist())
    culprits = []
    for b in unfinished.tolist():
        if lane_ptr[b + 1] - lane_ptr[b] < 2:
            continue
        seen, todo = set(), list(waits_for[b])
        while todo:
            x = todo.pop()
            if x == b:
                culprits.append(b)
                break
            if x not in seen:
                seen.add(x)
                todo += waits_for.get(x, ())
    if culprits:
        return culprits
    return [b for b in unfinished.tolist() if lane_ptr[b + 1] - lane_ptr[b] > 1]


def sweep(graph: SweepGraph, durations: np.ndarray, transfer: np.ndarray) -> Timeline:
    """One sweep (discover): the timeline of `graph` for these durations and transfers."""
    return discover(graph, durations, transfer)[1]


# ------------------------------------------------------------------------------------------- errors


def _raise_stuck(graph: SweepGraph, code, link, next_event: np.ndarray, parked_on: np.ndarray) -> None:
    """Explain a rank-by-rank sweep that stopped with ranks left: follow who waits for whom to a cycle."""
    at = {r: int(next_event[r]) for r in range(graph.n_ranks) if parked_on[r] >= 0}
    rank = min(at)
    hops: list[str] = []
    seen: list[int] = []
    while rank in at and rank not in seen:
        seen.append(rank)
        event = at[rank]
        members = np.flatnonzero((link == link[event]) & (code == ARRIVE))
        missing = [int(e) for e in members if e >= next_event[graph.rank_of(int(e))]]
        if not missing:  # cannot happen after prepare(): the comm would be complete
            break
        needed = missing[0]
        r, s = graph.where(event)
        r2, s2 = graph.where(needed)
        lead = f"rank {r} seq {s} ({graph.what(event)})" if not hops else (
            f"rank {r} is stuck at seq {s} ({graph.what(event)}), which")
        hops.append(f"{lead} needs rank {r2} seq {s2} ({graph.what(needed)})")
        rank = r2
    if rank in seen:
        hops.append(f"rank {rank} is stuck at seq {graph.where(at[rank])[1]}")
    stuck = sorted(at)
    listed = ", ".join(map(str, stuck[:16])) + (" ..." if len(stuck) > 16 else "")
    raise SweepError(
        "dependency cycle: " + "; ".join(hops)
        + f". The job would deadlock (ranks {listed} cannot progress): check the order in which these ranks "
        "issue their sends, recvs and collectives"
    )
