"""The global-clock sweep: numba kernels, linear in the number of events.

Semantics: the clock rule of `prism.clock_rule` (the one definition, shared with the runtime's timed replay),
and the same as `prism.calibrate.reference`, which tests hold these kernels to, bit for bit: every rank's
clock starts at 0; an event starts when its rank's previous event ended; a PLAIN event or an op ends at
start + duration; a comm's completion is (last member's issue start) + transfer for a collective,
max(recv issue, send issue + transfer) for a send/recv pair; a wait on a collective or a recv ends its own
duration after max(its start, the completion); a wait on a send is local; ops without a wait never block.
All times are int64 ns. *Pinned* rows (`arrays.Pins`) keep their given start and end: the rank's clock is
their end after them, a pinned issue arrives at its given start, and a pinned wait waits for nothing (the
emulation's tail, `prism.emulate.tail`, sweeps its computed rows from the live ones so).

Two passes:

- `discover`: a worklist over *bundles*; a bundle runs until a wait whose comm is incomplete, then parks
  on that comm and is woken when its last member arrives. The order is recorded as segments
  (bundle, first step, number of steps). It also returns the first timeline.
- `Schedule.replay` (`prism.calibrate.schedule`): the same computation with new durations in the recorded
  order: no worklist, no checks, a linear pass over arrays laid out in that order (`Schedule.to_schedule`).

A bundle is a set of ranks with identical code sequences (`arrays.prepare`) that share collectives,
e.g. a TP group, or a whole pipeline stage of identical DP replicas: they advance in lockstep, one step
(one event per lane) at a time, so the per-event branch on the code is paid once per step and the lane
loops vectorize. Lockstep can only delay a lane, never change a time (every event's time depends only on
its own dependencies), so the result is exact; it can, on an unusual graph, block a bundle that would
progress rank by rank: discover then splits the bundles that blocked into single ranks and sweeps again.
Single ranks that block are a real dependency cycle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prism.calibrate.arrays import (
    ARRIVE,
    K_RECV,
    PIN,
    PIN_ARRIVE,
    PLAIN,
    RECV,
    WAIT,
    Pins,
    SweepError,
    SweepGraph,
    check_durations,
    check_pins,
    pin,
    prepare,
)
from prism.calibrate.bundles import bundles, split
from prism.calibrate.schedule import Schedule, Timeline, _comm_times, _starts
from prism.clock_rule import NEG, collective_done, ends, wait_ends

__all__ = ["NEG", "Pins", "Schedule", "SweepError", "Timeline", "discover", "sweep"]


# ------------------------------------------------------------------------------------------ discover


@njit(cache=True)
def _discover(code, link, dur, xfer, need, pin_start, pin_end, lane_ptr, lane_base, nsteps, max_segments, n_steps,
              n_comm_events, end, acc):
    """The worklist sweep; fills `end` (event order) and `acc` (max arrival per comm).

    `pin_start` / `pin_end` (event order) are read at the pinned codes only (empty without pins).
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
                    t = ends(clock[l], dur[e])
                    clock[l] = t
                    end[e] = t
            elif cd >= ARRIVE:  # an arrival; RECV, PIN_ARRIVE, PIN_RECV only where there are pins (`arrays.pin`)
                for l in range(l0, l1):
                    e = lane_base[l] + st
                    c = link[e]
                    t = clock[l]
                    a = t
                    if cd != ARRIVE:
                        t = t if cd == RECV else pin_start[e]
                        a = t if cd == PIN_ARRIVE else t - xfer[c]  # a recv: see `arrays`
                    latest = acc[c]
                    acc[c] = a if a > latest else latest
                    arrived[c] += 1
                    if arrived[c] == need[c]:
                        q = park_head[c]
                        while q >= 0:
                            nxt = park_next[q]
                            stack[sp] = q
                            sp += 1
                            q = nxt
                        park_head[c] = -1
                    t = ends(t, dur[e]) if cd <= RECV else pin_end[e]
                    clock[l] = t
                    end[e] = t
            elif cd == WAIT:
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
                    t = wait_ends(clock[l], dur[e], collective_done(acc[c], xfer[c]))
                    clock[l] = t
                    end[e] = t
            elif cd == PIN:
                for l in range(l0, l1):
                    e = lane_base[l] + st
                    clock[l] = pin_end[e]
                    end[e] = pin_end[e]
            step_code[kp] = cd
            kp += 1
            if cd >= WAIT:  # a step on a comm
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


def _finish(sched: "Schedule", end: np.ndarray, acc: np.ndarray, xfer: np.ndarray, pins: Pins | None) -> Timeline:
    """The discover sweep's timeline: starts derived from `end` (a pinned row's given), comm times from the
    arrivals."""
    out = Timeline(np.empty_like(end), end, np.empty_like(acc), np.empty_like(acc))
    _starts(sched.graph.rank_ptr, end, out.start_ns)
    if pins is not None:
        np.copyto(out.start_ns, pins.start_ns, where=pins.rows)
    _comm_times(acc, xfer, np.arange(len(acc)), sched.graph.comm_p2p, sched.recv_of, out.start_ns,
                out.comm_start_ns, out.comm_end_ns)
    return out


def discover(
    graph: SweepGraph,
    durations: np.ndarray,
    transfer: np.ndarray,
    bundle: bool = True,
    pins: Pins | None = None,
) -> tuple[Schedule, Timeline]:
    """The first sweep: checks the graph, finds the order, returns it with the timeline.

    `bundle=False` runs one rank per bundle. `pins`: rows whose times are given, kept as they are, a pinned
    issue arriving at its given start (`arrays.Pins`); the schedule's replays then take the same pinned rows.
    Raises `SweepError` on an inconsistent graph (unmatched comm, wait on no op, ...) or a dependency cycle,
    naming the ranks and events involved.
    """
    code, link, need = prepare(graph)
    durations, transfer = check_durations(graph, durations, transfer)
    no_pins = np.empty(0, dtype=np.int64)
    pin_start = pin_end = no_pins
    if pins is not None:
        pins = check_pins(graph, pins)
        code, link, need = pin(graph, code, link, need, pins.rows)
        pin_start, pin_end = pins.start_ns, pins.end_ns
    n_comm_events = int(np.count_nonzero(code >= WAIT))
    lane_ptr, lane_rank = bundles(graph, code, link, bundle)
    while True:
        lane_base = graph.rank_ptr[lane_rank].astype(np.int64)
        nsteps = np.diff(graph.rank_ptr)[lane_rank[lane_ptr[:-1]]].astype(np.int64)
        max_seg = _max_segments(code, lane_ptr, lane_base, nsteps)
        end = np.empty(graph.n_events, dtype=np.int64)
        acc = np.full(graph.n_comms, NEG, dtype=np.int64)
        ns, seg_b, seg_lo, seg_n, finished, cursor, parked_on, step_code, step_comm, comm_order = _discover(
            code, link, durations, transfer, need, pin_start, pin_end, lane_ptr, lane_base, nsteps, max_seg,
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
        recv_of, len(lane_ptr) - 1 < graph.n_ranks, None if pins is None else pins.rows,
    )
    return sched, _finish(sched, end, acc, transfer, pins)


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
    arrivals = np.flatnonzero(code >= ARRIVE)
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


def sweep(graph: SweepGraph, durations: np.ndarray, transfer: np.ndarray, pins: Pins | None = None) -> Timeline:
    """One sweep (discover): the timeline of `graph` for these durations and transfers (and `pins`)."""
    return discover(graph, durations, transfer, pins=pins)[1]


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
        members = np.flatnonzero((link == link[event]) & (code >= ARRIVE))
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
