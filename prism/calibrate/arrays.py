"""The sweep's input: a job's event graph as flat numpy arrays (`SweepGraph`), and its checks.

Events are stored rank-major in program order: rank ``r``'s events are ``rank_ptr[r]:rank_ptr[r+1]``,
and an event's index is its ``event_id`` position. ``kind`` uses `KINDS` (the order of
``prism.schemas.EVENT_KINDS``); ``comm`` links an op (collective / send / recv) to its comm, ``wait_op``
links a wait to the op it waits on. Op and group names are kept only for error messages.

What the sweep needs from an event is one of three codes (`prepare`):

- ``PLAIN``: takes its duration and nothing else (compute, marker, a recv's issue, a wait on a send:
  sends complete locally);
- ``ARRIVE``: an op that contributes to a comm (a collective member, a send); it never blocks its rank;
- ``WAIT``: a wait on a collective or a recv, which ends its own duration after max(its start, the comm's
  completion) (`prism.clock_rule.wait_ends`).

A recv's own issue time never matters to its wait: the wait starts after the recv was issued, so
max(wait start, recv issue, send issue + transfer) = max(wait start, send issue + transfer).
Hence a p2p comm is complete once its send arrived, and a collective once all its members did.

*Pinned* rows (`Pins`, rows whose start and end are given: the emulation's live rows, `prism.emulate.tail`)
get four more codes (`pin`): ``PIN``, the row takes its given end (a pinned wait waits for nothing), and
``PIN_ARRIVE``, a pinned arrival, at its given start. Given times need not chain (a measured row may start
after the computed rows that follow it end), so with pins a recv's issue can be later than its wait's start
and then matters: every recv arrives too, ``RECV`` (computed) and ``PIN_RECV`` (pinned), with its issue
minus the transfer, so that the latest arrival plus the transfer is max(recv issue, send issue + transfer),
`prism.clock_rule.p2p_done`. The codes are ordered so that ``code >= WAIT`` is on a comm and
``code >= ARRIVE`` arrives at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from prism import schemas

KINDS = schemas.EVENT_KINDS  # compute, collective, send, recv, wait, marker
K_COMPUTE, K_COLLECTIVE, K_SEND, K_RECV, K_WAIT, K_MARKER = range(len(KINDS))
PLAIN, PIN, WAIT, ARRIVE, RECV, PIN_ARRIVE, PIN_RECV = range(7)


class SweepError(ValueError):
    """The graph cannot be swept: a dependency cycle, an unmatched comm, bad durations.

    The message names the rank, seq, op and group of the offending event.
    """


@dataclass(eq=False)
class Pins:
    """Rows whose times are given: the sweep keeps them and runs the others from them (module docstring)."""

    rows: np.ndarray  # bool[n]: the pinned rows
    start_ns: np.ndarray  # int64[n]: their starts (an issue: its arrival); read at pinned rows only
    end_ns: np.ndarray  # int64[n]: their ends (their rank's clock after them)


@dataclass(eq=False)
class SweepGraph:
    """A job's events and comms as arrays (see the module docstring for the layout)."""

    rank_ptr: np.ndarray  # int64[W + 1]
    kind: np.ndarray  # int8[n], index into KINDS
    comm: np.ndarray  # int64[n], comm id of an op event, -1 otherwise
    wait_op: np.ndarray  # int64[n], event index of the op a wait waits on, -1 otherwise
    comm_p2p: np.ndarray  # bool[m], True: a matched send/recv pair, False: a collective
    op_code: np.ndarray | None = None  # int32[n] into op_names (messages only)
    op_names: list[str] = field(default_factory=list)
    group_code: np.ndarray | None = None  # int32[n] into group_names, -1: none (messages only)
    group_names: list[str] = field(default_factory=list)
    comm_ids: np.ndarray | None = None  # int64[m]: the comm ids the job's tables use (messages only)

    @property
    def n_ranks(self) -> int:
        return len(self.rank_ptr) - 1

    @property
    def n_events(self) -> int:
        return len(self.kind)

    @property
    def n_comms(self) -> int:
        return len(self.comm_p2p)

    def rank_of(self, event: int) -> int:
        return int(np.searchsorted(self.rank_ptr, event, side="right") - 1)

    def where(self, event: int) -> tuple[int, int]:
        """(rank, seq) of an event."""
        rank = self.rank_of(event)
        return rank, event - int(self.rank_ptr[rank])

    def what(self, event: int) -> str:
        """'wait on all_reduce on group "tp0"', 'send on group "pp"', 'marker iteration_end'."""
        kind = KINDS[int(self.kind[event])]
        target = int(self.wait_op[event]) if kind == "wait" else -1
        if self.op_code is not None:
            op = self.op_names[int(self.op_code[event])]
        else:
            op = KINDS[int(self.kind[target])] if 0 <= target < self.n_events else kind
        text = f"wait on {op}" if kind == "wait" else f"marker {op}" if kind == "marker" else op
        if self.group_code is not None:
            group = int(self.group_code[event])
            if group < 0 and 0 <= target < self.n_events:  # a wait: the group of the op it waits on
                group = int(self.group_code[target])
            if group >= 0:
                text += f" on group {self.group_names[group]!r}"
        return text

    def describe(self, event: int) -> str:
        """'rank 3 seq 17: wait on all_reduce on group "tp0"' for messages."""
        rank, seq = self.where(event)
        return f"rank {rank} seq {seq}: {self.what(event)}"

    def comm_name(self, comm: int) -> str:
        return str(int(self.comm_ids[comm])) if self.comm_ids is not None else str(comm)


# first inconsistency found by _codes
_E_NO_COMM, _E_WAIT, _E_KIND, _E_P2P, _E_MIXED, _E_EMPTY = range(1, 7)


@njit(cache=True)
def _codes(rank_ptr, kind, comm, wait_op, comm_p2p):
    """One pass: codes, links, arrivals needed per comm, and the first inconsistency (status, index)."""
    n = len(kind)
    m = len(comm_p2p)
    code = np.zeros(n, dtype=np.int8)
    link = np.full(n, -1, dtype=np.int32)
    counts = np.zeros((m, 3), dtype=np.int64)  # sends, recvs, collective members
    need = np.zeros(m, dtype=np.int64)
    for r in range(len(rank_ptr) - 1):
        lo = rank_ptr[r]
        for e in range(lo, rank_ptr[r + 1]):
            k = kind[e]
            if k == K_COLLECTIVE or k == K_SEND or k == K_RECV:
                c = comm[e]
                if c < 0 or c >= m:
                    return _E_NO_COMM, e, code, link, need
                if k == K_RECV:
                    counts[c, 1] += 1
                else:
                    counts[c, 0 if k == K_SEND else 2] += 1
                    need[c] += 1
                    code[e] = ARRIVE
                    link[e] = c
            elif k == K_WAIT:
                t = wait_op[e]
                if t < lo or t >= e:
                    return _E_WAIT, e, code, link, need
                kt = kind[t]
                if kt == K_COLLECTIVE or kt == K_RECV:
                    code[e] = WAIT
                    link[e] = comm[t]
                elif kt != K_SEND:
                    return _E_WAIT, e, code, link, need
            elif k != K_COMPUTE and k != K_MARKER:
                return _E_KIND, e, code, link, need
    for c in range(m):
        if comm_p2p[c]:
            if counts[c, 0] != 1 or counts[c, 1] != 1 or counts[c, 2] != 0:
                return _E_P2P, c, code, link, need
        elif counts[c, 0] + counts[c, 1] > 0:
            return _E_MIXED, c, code, link, need
        elif counts[c, 2] == 0:
            return _E_EMPTY, c, code, link, need
    return 0, -1, code, link, need


def prepare(graph: SweepGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check the graph and derive what the sweep runs on, in one linear pass.

    Returns (code int8[n], link int32[n], need int64[m]): each event's code, the comm it arrives at or
    waits on (-1: none), and how many arrivals complete each comm. Raises `SweepError` naming the rank,
    seq, op and group of the first event (or comm) that makes the graph unsweepable.
    """
    n, m, w = graph.n_events, graph.n_comms, graph.n_ranks
    ptr = graph.rank_ptr
    if w < 0 or len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != n or np.any(np.diff(ptr) < 0):
        raise SweepError(f"rank_ptr must run from 0 to the number of events ({n}) without decreasing")
    for name in ("kind", "comm", "wait_op"):
        if len(getattr(graph, name)) != n:
            raise SweepError(f"{name} has {len(getattr(graph, name))} entries for {n} events")
    if m >= 2**31:
        raise SweepError(f"{m} comms: more than the sweep's 2**31 - 1")
    status, i, code, link, need = _codes(
        np.ascontiguousarray(ptr, dtype=np.int64), np.ascontiguousarray(graph.kind, dtype=np.int8),
        np.ascontiguousarray(graph.comm, dtype=np.int64), np.ascontiguousarray(graph.wait_op, dtype=np.int64),
        np.ascontiguousarray(graph.comm_p2p, dtype=np.bool_),
    )
    if status:
        raise SweepError(_message(graph, status, int(i)))
    return code, link, need


def validate(graph: SweepGraph) -> None:
    """Raise `SweepError` unless the arrays form a graph the sweep can run."""
    prepare(graph)


def _message(graph: SweepGraph, status: int, i: int) -> str:
    if status == _E_KIND:
        return f"event {i} (rank {graph.rank_of(i)}): unknown kind code {int(graph.kind[i])}"
    if status == _E_NO_COMM:
        return (
            f"{graph.describe(i)}: unmatched comm (comm_id {int(graph.comm[i])}: the op takes part in no "
            "comm), so its wait would never complete; rebuild the graph (`prism graph`)"
        )
    if status == _E_WAIT:
        return (
            f"{graph.describe(i)}: waits on event {int(graph.wait_op[i])}, which is not an earlier "
            "collective, send or recv of the same rank"
        )
    members = np.flatnonzero(graph.comm == i)
    where = graph.describe(int(members[0])) if len(members) else "no member event"
    kinds = np.bincount(graph.kind[members], minlength=len(KINDS))
    if status == _E_P2P:
        return (
            f"p2p comm {graph.comm_name(i)} ({where}): unmatched, it has {int(kinds[K_SEND])} send(s) and "
            f"{int(kinds[K_RECV])} recv(s) (and {int(kinds[K_COLLECTIVE])} collective members), "
            "expected exactly one send and one recv"
        )
    if status == _E_MIXED:
        return (
            f"collective comm {graph.comm_name(i)} ({where}): has send/recv members; a comm is either a "
            "collective or one send/recv pair"
        )
    return f"collective comm {graph.comm_name(i)}: no member events (an unmatched comm)"


def check_durations(
    graph: SweepGraph, durations: np.ndarray, transfer: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The durations (int64[n]) and transfers (int64[m]), checked: right lengths, no negative value."""
    durations = np.ascontiguousarray(durations, dtype=np.int64)
    transfer = np.ascontiguousarray(transfer, dtype=np.int64)
    if durations.shape != (graph.n_events,):
        raise SweepError(f"durations has shape {durations.shape}, expected ({graph.n_events},): one per event")
    if transfer.shape != (graph.n_comms,):
        raise SweepError(f"transfer has shape {transfer.shape}, expected ({graph.n_comms},): one per comm")
    if durations.size and durations.min() < 0:
        bad = int(np.argmax(durations < 0))
        raise SweepError(f"{graph.describe(bad)}: negative duration {int(durations[bad])} ns")
    if transfer.size and transfer.min() < 0:
        bad = int(np.argmax(transfer < 0))
        raise SweepError(f"comm {graph.comm_name(bad)}: negative transfer {int(transfer[bad])} ns")
    return durations, transfer


def check_pins(graph: SweepGraph, pins: Pins) -> Pins:
    """`pins` as contiguous arrays of the right types, checked: one entry per event in each."""
    rows = np.ascontiguousarray(pins.rows, dtype=np.bool_)
    start = np.ascontiguousarray(pins.start_ns, dtype=np.int64)
    end = np.ascontiguousarray(pins.end_ns, dtype=np.int64)
    for name, a in (("rows", rows), ("start_ns", start), ("end_ns", end)):
        if a.shape != (graph.n_events,):
            raise SweepError(f"pins.{name} has shape {a.shape}, expected ({graph.n_events},): one per event")
    return Pins(rows, start, end)


def pin(graph: SweepGraph, code: np.ndarray, link: np.ndarray, need: np.ndarray,
        rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`prepare`'s (code, link, need) with the pinned `rows` (bool[n]) and the recvs coded (module docstring)."""
    code, link, need = code.copy(), link.copy(), need.copy()
    recv = np.flatnonzero(graph.kind == K_RECV)
    link[recv] = graph.comm[recv]
    need += np.bincount(graph.comm[recv], minlength=graph.n_comms)
    arrives = code == ARRIVE
    code[rows] = PIN
    code[rows & arrives] = PIN_ARRIVE
    code[recv] = np.where(rows[recv], PIN_RECV, RECV)
    return code, link, need
