"""The sweep's results and its replay in a recorded order: `Timeline`, `Schedule` (see `prism.calibrate.sweep`).

`prism.calibrate.sweep.discover` records the order in which the bundles ran (segments: bundle, first step,
steps); a `Schedule` replays that order with new durations and transfers, over arrays laid out in it: no
worklist, no checks, a linear pass. The clock rule the kernel applies is `prism.clock_rule`'s, as in discover.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from prism.calibrate.arrays import ARRIVE, PIN, PIN_ARRIVE, PLAIN, RECV, WAIT
from prism.calibrate.arrays import Pins, SweepError, SweepGraph, check_durations, check_pins
from prism.clock_rule import NEG, collective_done, ends, p2p_done, wait_ends

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
def _replay(seg_b, seg_n, lane_ptr, step_code, cid, dur_s, xfer_s, pin_start_s, pin_end_s, clock, acc, end_s):
    """The sweep in the recorded order over schedule-ordered arrays: `end_s` <- end times, `acc` <- arrivals.

    `cid`, `xfer_s` and `acc` use the schedule's comm numbering; `pin_start_s` / `pin_end_s` are read at
    pinned codes only (empty without pins). The max on arrival is a select, not a branch: which member
    arrives last is random, a branch on it mispredicts.
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
                    t = ends(clock[l0 + l], dur_s[pos + l])
                    clock[l0 + l] = t
                    end_s[pos + l] = t
            elif cd == ARRIVE:
                for l in range(g):
                    c = cid[cp + l]
                    t = clock[l0 + l]
                    a = acc[c]
                    acc[c] = t if t > a else a
                    t = ends(t, dur_s[pos + l])
                    clock[l0 + l] = t
                    end_s[pos + l] = t
                cp += g
            elif cd == WAIT:
                for l in range(g):
                    c = cid[cp + l]
                    t = wait_ends(clock[l0 + l], dur_s[pos + l], collective_done(acc[c], xfer_s[c]))
                    clock[l0 + l] = t
                    end_s[pos + l] = t
                cp += g
            elif cd == PIN:
                for l in range(g):
                    t = pin_end_s[pos + l]
                    clock[l0 + l] = t
                    end_s[pos + l] = t
            else:  # RECV, PIN_ARRIVE, PIN_RECV (`arrays.pin`)
                for l in range(g):
                    c = cid[cp + l]
                    t = clock[l0 + l] if cd == RECV else pin_start_s[pos + l]
                    a = t if cd == PIN_ARRIVE else t - xfer_s[c]
                    acc[c] = a if a > acc[c] else acc[c]
                    t = ends(t, dur_s[pos + l]) if cd == RECV else pin_end_s[pos + l]
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
        if p2p[c]:
            r = start[recv_of[c]]
            comm_start[c] = a if a > r else r
            comm_end[c] = p2p_done(r, a, xfer[i])
        else:
            comm_start[c] = a
            comm_end[c] = collective_done(a, xfer[i])


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
    pinned: np.ndarray | None = None  # bool[n]: the rows discover had pinned (`arrays.Pins`); None: none
    _scratch: dict = field(default_factory=dict, repr=False)

    @property
    def n_bundles(self) -> int:
        return len(self.lane_ptr) - 1

    @property
    def nbytes(self) -> int:
        """Memory the schedule holds (not counting the graph), scratch buffers included."""
        arrays = (self.lane_ptr, self.lane_rank, self.lane_base, self.seg_bundle, self.seg_first,
                  self.seg_steps, self.bundle_steps, self.step_code, self.step_comm, self.comm_order, self.recv_of,
                  *(() if self.pinned is None else (self.pinned,)), *self._scratch.values())
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
        acc: np.ndarray | None = None, pins_s: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The replay kernel alone, all in schedule order: (end times, max arrival per schedule comm).

        `out` (int64[n]) and `acc` (int64[m]) are reused when given: repeated sweeps need no new memory.
        `pins_s`: the pinned rows' (starts, ends) in schedule order, for a schedule discovered with pins.
        """
        clock = np.zeros(len(self.lane_rank), dtype=np.int64)
        acc = np.empty(self.graph.n_comms, dtype=np.int64) if acc is None else acc
        acc.fill(NEG)
        end_s = np.empty(self.graph.n_events, dtype=np.int64) if out is None else out
        if (pins_s is None) != (self.pinned is None):
            raise SweepError("this schedule was discovered with pinned rows: replay it with pins" if pins_s is None
                             else "this schedule was discovered without pins: discover again with them")
        pin_start_s, pin_end_s = (np.empty(0, dtype=np.int64),) * 2 if pins_s is None else pins_s
        _replay(self.seg_bundle, self.seg_steps, self.lane_ptr, self.step_code, self.step_comm,
                durations_s, transfer_s, pin_start_s, pin_end_s, clock, acc, end_s)
        return end_s, acc

    def replay(self, durations: np.ndarray, transfer: np.ndarray, out: Timeline | None = None,
               pins: Pins | None = None) -> Timeline:
        """The timeline for new durations (event order) and transfers, in the recorded order.

        A schedule discovered with pins replays with pins on the same rows (their times may change)."""
        durations, transfer = check_durations(self.graph, durations, transfer)
        n, m = self.graph.n_events, self.graph.n_comms
        pins_s = None
        if pins is not None:
            pins = check_pins(self.graph, pins)
            if self.pinned is not None and not np.array_equal(pins.rows, self.pinned):
                raise SweepError("pins.rows differ from the rows this schedule was discovered with: the order "
                                 "it recorded may not hold, discover again with these pins")
            pins_s = (self.to_schedule(pins.start_ns, out=self._buffer("pin_start", n)),
                      self.to_schedule(pins.end_ns, out=self._buffer("pin_end", n)))
        dur_s = self.to_schedule(durations, out=self._buffer("durations", n))
        xfer_s = self.transfer_to_schedule(transfer, out=self._buffer("transfer", m))
        end_s, acc = self.replay_scheduled(dur_s, xfer_s, out=self._buffer("end", n), acc=self._buffer("acc", m),
                                           pins_s=pins_s)
        out = Timeline.empty(n, m) if out is None else out
        self.from_schedule(end_s, out=out.end_ns, start=out.start_ns)
        if pins is not None:
            np.copyto(out.start_ns, pins.start_ns, where=pins.rows)
        _comm_times(acc, xfer_s, self.comm_order, self.graph.comm_p2p, self.recv_of, out.start_ns,
                    out.comm_start_ns, out.comm_end_ns)
        return out
