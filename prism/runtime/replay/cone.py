"""The sandbox's dependency cone in a calibrated job: which virtual events must run in wall-clock time.

The model is the calibrate sweep's (`prism.clock_rule`, the one definition both import): program order within a rank; a comm's
completion follows its members' issues (arrivals); a wait on a collective or on a recv ends no earlier than
that completion (a wait on a send is local). A *real* comm has a sandbox member: it happens for real.

- `after`: virtual events whose time can depend on a real comm's completion (the sandbox's influence);
- `before`: virtual events whose time can move a virtual member's arrival at a real comm;
- live = after & before: the events *between* two real communications, the only ones that must be driven
  in wall-clock time. Events only `before` keep their calibrated times (nothing the sandbox does moves
  them); events only `after` move nothing the sandbox sees, so the emulate stage's sweep (with the sandbox's
  measured durations) computes them afterwards.

`after` is a suffix and `before` a prefix of each rank's program order, so each rank's live events are one
contiguous run. Both are fixpoints of vectorised passes (numpy, no per-event Python loop) over per-rank
bounds: one comm hop per pass, every rank at once.

`load(events_path, timeline_path, sandbox, steps_limit)` reads ``graph/events.parquet`` and
``calibrated/timeline.parquet`` with pyarrow and returns a `Job` with these arrays; it is shared by the
runtime (`timed_replay`) and the analysis side (`prism bench emulate` reports the cone's size).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism import schemas
from prism.clock_rule import NEG, transfer_of, wait_own

# event codes of the timed replay (`timed_replay._advance`)
PLAIN, ARRIVE, ARRIVE_SEND, ARRIVE_RECV, WAIT, LOCAL_WAIT = 0, 1, 2, 3, 4, 5


class ConeError(ValueError):
    """The job's graph and calibrated timeline do not fit together (the message names the fix)."""


@dataclass(eq=False)
class Job:
    """A calibrated job as arrays in graph order ((rank, seq)), plus the cone of a sandbox."""

    pos: np.ndarray  # int64[n]: row of each event in graph/events.parquet (the arrays are in (rank, seq) order)
    rank: np.ndarray  # int32[n]
    seq: np.ndarray  # int64[n]
    iteration: np.ndarray  # int32[n]
    code: np.ndarray  # int8[n]: PLAIN, ARRIVE*, WAIT (on a collective / recv), LOCAL_WAIT (on a send)
    comm: np.ndarray  # int64[n]: comm index (0..m-1) of an issue or of the op a WAIT waits on; -1
    comm_ids: np.ndarray  # int64[m]: the graph's comm_id of each comm index
    p2p: np.ndarray  # bool[m]
    real: np.ndarray  # bool[m]: a sandbox rank takes part
    start: np.ndarray  # int64[n]: calibrated start
    end: np.ndarray  # int64[n]: calibrated end
    dur: np.ndarray  # int64[n]: what the replay lasts (a WAIT: its own time besides waiting)
    xfer: np.ndarray  # int64[m]: calibrated transfer (completion - last arrival; p2p: - the send's arrival)
    completion: np.ndarray  # int64[m]: calibrated completion (its earliest blocking wait's end; NEG: none)
    virtual: np.ndarray  # bool[n]: a virtual rank's event kept for the replay (within --steps-limit)
    after: np.ndarray  # bool[n]
    before: np.ndarray  # bool[n]
    live: np.ndarray  # bool[n]

    @property
    def cone_size(self) -> tuple[int, int]:
        """(live virtual events, all virtual events kept)."""
        return int(self.live.sum()), int(self.virtual.sum())


def _np(col) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False) if isinstance(col, (pa.Array, pa.ChunkedArray)) else np.asarray(col)


def _is(kinds: pa.ChunkedArray, *names: str) -> np.ndarray:
    return _np(pc.is_in(kinds, pa.array(list(names)))).astype(bool)


def load(events_path: Path, timeline_path: Path, sandbox, steps_limit: int | None = None) -> Job:
    ev = pq.read_table(events_path, columns=["event_id", "rank", "seq", "kind", "comm_id", "op_event_id",
                                              "iteration"])
    tl = pq.read_table(timeline_path, columns=["event_id", "start_ns", "end_ns"])
    rank0 = _np(ev["rank"]).astype(np.int64)
    seq0 = _np(ev["seq"]).astype(np.int64)
    order = np.lexsort((seq0, rank0))
    if not np.array_equal(order, np.arange(len(order))):
        ev = ev.take(pa.array(order))
    kinds = ev["kind"].cast(pa.string())
    ids = _np(ev["event_id"]).astype(np.int64)
    n = len(ids)
    # calibrated times by event id (the calibrate stage writes them in graph order: then no search)
    tl_ids = _np(tl["event_id"]).astype(np.int64)
    start = _np(tl["start_ns"]).astype(np.int64)
    end = _np(tl["end_ns"]).astype(np.int64)
    if not np.array_equal(tl_ids, ids):
        sort = np.argsort(tl_ids, kind="stable")
        at = np.searchsorted(tl_ids[sort], ids)
        at = np.minimum(at, len(tl_ids) - 1) if len(tl_ids) else at
        if len(tl_ids) < n or not np.array_equal(tl_ids[sort][at], ids):
            raise ConeError(f"{timeline_path} does not time every event of {events_path}: calibrate the job "
                            "again (prism calibrate --job DIR)")
        start, end = start[sort][at], end[sort][at]
    rank = _np(ev["rank"]).astype(np.int32)
    sandbox_ranks = np.asarray(sorted(sandbox), dtype=np.int32)
    in_sandbox = np.isin(rank, sandbox_ranks)
    iteration = _np(ev["iteration"]).astype(np.int32)

    # comms: the issue events (collective / send / recv with a comm) renumbered 0..m-1
    issue = _is(kinds, *schemas.COMM_KINDS)
    raw_comm = _np(ev["comm_id"]).astype(np.int64)
    issue &= raw_comm >= 0
    comm_ids, inv = np.unique(raw_comm[issue], return_inverse=True)
    m = len(comm_ids)
    comm = np.full(n, -1, dtype=np.int64)
    comm[issue] = inv
    is_send, is_recv = _is(kinds, schemas.KIND_SEND) & issue, _is(kinds, schemas.KIND_RECV) & issue
    code = np.full(n, PLAIN, dtype=np.int8)
    code[issue] = ARRIVE
    code[is_send], code[is_recv] = ARRIVE_SEND, ARRIVE_RECV
    p2p = np.zeros(m, dtype=bool)
    p2p[comm[is_send | is_recv]] = True
    real = np.zeros(m, dtype=bool)
    real[comm[issue & in_sandbox]] = True

    # waits: on the op `op_event_id` names; blocking on a collective or a recv, local on a send
    wait = _is(kinds, schemas.KIND_WAIT)
    op_ids = _np(ev["op_event_id"]).astype(np.int64)
    id_sort = np.arange(n) if np.array_equal(ids, np.arange(n)) else np.argsort(ids, kind="stable")
    w_idx = np.flatnonzero(wait & (op_ids >= 0))
    op_at = np.searchsorted(ids[id_sort], op_ids[w_idx])
    op_at = np.minimum(op_at, n - 1)
    found = ids[id_sort][op_at] == op_ids[w_idx]
    w_idx, op_pos = w_idx[found], id_sort[op_at[found]]
    on_comm = comm[op_pos] >= 0
    w_idx, op_pos = w_idx[on_comm], op_pos[on_comm]
    comm[w_idx] = comm[op_pos]
    code[w_idx] = np.where(code[op_pos] == ARRIVE_SEND, LOCAL_WAIT, WAIT)
    code[wait & (code == PLAIN)] = LOCAL_WAIT  # a wait on nothing known: its own time only

    # calibrated arrivals, completions (the earliest end of a blocking wait) and transfers
    blocking = code == WAIT
    acc = np.full(m, NEG, dtype=np.int64)
    np.maximum.at(acc, comm[issue], start[issue])
    acc_send = np.full(m, NEG, dtype=np.int64)
    np.maximum.at(acc_send, comm[is_send], start[is_send])
    done = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(done, comm[blocking], end[blocking])
    waited = done != np.iinfo(np.int64).max
    base = np.where(p2p, acc_send, acc)
    xfer = np.where(waited & (base > NEG), transfer_of(done, base), 0).astype(np.int64)
    dur = np.maximum(end - start, 0)
    # a blocking wait's own time is what it lasts past max(its start, the completion) (`clock_rule.wait_ends`;
    # the completion taken as its comm's earliest wait end, so the first member to see it has 0)
    w = np.flatnonzero(blocking)
    dur[w] = wait_own(start[w], end[w], done[comm[w]])

    virtual = ~in_sandbox
    if steps_limit is not None:
        virtual &= iteration < steps_limit
    after, before = cone(rank, code, comm, real, virtual)
    return Job(pos=order.astype(np.int64), rank=rank, seq=_np(ev["seq"]).astype(np.int64), iteration=iteration,
               code=code, comm=comm, comm_ids=comm_ids, p2p=p2p, real=real, start=start, end=end, dur=dur,
               xfer=xfer, completion=np.where(waited, done, NEG).astype(np.int64), virtual=virtual, after=after, before=before, live=after & before)


def cone(rank: np.ndarray, code: np.ndarray, comm: np.ndarray, real: np.ndarray, virtual: np.ndarray):
    """(after, before) over the events (in (rank, seq) order) of the virtual ranks in `virtual`.

    Kept as per-rank bounds: `after` is every event from `lo[rank]` on, `before` every one up to `hi[rank]`;
    a pass looks only at the issues and the blocking waits (one comm hop), until the bounds stop moving."""
    n = len(rank)
    pos = np.arange(n, dtype=np.int64)
    world = int(rank.max()) + 1 if n else 0
    issue = np.flatnonzero((code >= ARRIVE) & (code <= ARRIVE_RECV) & virtual)
    wait = np.flatnonzero((code == WAIT) & virtual)
    i_rank, i_comm, w_rank, w_comm = rank[issue], comm[issue], rank[wait], comm[wait]
    # after: from the waits on real comms on, through every comm with a member issued after
    lo = _bound(world, n, real, (wait, w_rank, w_comm), (issue, i_rank, i_comm), later=True)
    # before: up to the virtual members' issues of real comms, through every comm a `before` wait waits on
    hi = _bound(world, -1, real, (issue, i_rank, i_comm), (wait, w_rank, w_comm), later=False)
    if n == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    return (pos >= lo[rank]) & virtual, (pos <= hi[rank]) & virtual



def _bound(world: int, fill: int, real: np.ndarray, seed: tuple, step: tuple, later: bool) -> np.ndarray:
    """Per rank, the earliest (`later`) or latest position of a `seed` event (a wait or an issue:
    positions, ranks, comms) on a comm in the closure; the closure starts at the real comms and takes in
    every comm with a `step` event at or after (before) its rank's bound, until the bounds stop moving."""
    pos, rank, comm = seed
    step_pos, step_rank, step_comm = step
    acc = np.minimum if later else np.maximum
    bound = np.full(world, fill, dtype=np.int64)
    acc.at(bound, rank[real[comm]], pos[real[comm]])
    while True:
        hit = real.copy()
        hit[step_comm[step_pos >= bound[step_rank] if later else step_pos <= bound[step_rank]]] = True
        sel = hit[comm]
        new = bound.copy()
        acc.at(new, rank[sel], pos[sel])
        if np.array_equal(new, bound):
            return bound
        bound = new

__all__ = ["ARRIVE", "ARRIVE_RECV", "ARRIVE_SEND", "ConeError", "Job", "LOCAL_WAIT", "NEG", "PLAIN", "WAIT",
           "cone", "load"]
