"""Per-event durations and per-comm transfers for the sweep.

Until slice runs exist, the durations come from the bare graph itself (`bare_graph`). This is the
*bare-graph baseline* that slice measurements will replace, event by event:

- compute and marker events: their own ``device_ns`` (the device clock: on CPU the rank's thread CPU
  time, which capture never measures across a context switch; on CUDA the GPU time between the event's
  boundaries on the rank's stream, from CUDA events -- the host's CPU time of a CUDA compute segment is
  only the time to launch its kernels);
- comm ops (collective, send, recv): the op's own issue time ``t_end_ns - t_start_ns`` (issuing does
  not wait for the peers);
- waits: their own ``cpu_ns``: what the rank's thread spends in the wait besides waiting (copying results
  out); the waiting itself is what the sweep adds (a wait ends at max(start + own, comm completion)). On
  CPU ``cpu_ns`` equals ``device_ns``; on CUDA a wait's ``device_ns`` spans the host's blocking (its end
  event is queued only once the host returns from the wait), so it would count the waiting twice.
  `own_ns` makes this per-kind choice of clock; the callers pass its result to `bare_graph`.
- a comm's transfer (the time from its last member's issue to its completion, measured without
  waiting): min over the members that wait on it of (the wait's end - the last member's issue start),
  clipped at 0. A member without a wait event (consumed through a future) counts with the op's
  ``t_complete_ns`` instead when it was recorded; a comm nobody waited on gets 0. For a send/recv pair
  only the recv side counts (a send completes locally). The minimum is taken because, in capture, a
  member may resume long after completion (it waited for a device slot): the member that resumed first
  is the closest to the transfer itself.

A column with no measurement (``-1``) falls back to the event's wall span ``t_end_ns - t_start_ns``.

`read_durations` / `read_transfers` read explicit tables instead (``event_id, duration_ns`` and
``comm_id, transfer_ns``), checked against the graph: one row per event (comm), the same ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from prism import schemas
from prism.artifacts import ArtifactError, read_parquet
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_MARKER, K_RECV, K_SEND, K_WAIT

DURATIONS_COLUMNS = ("event_id", "duration_ns")
TRANSFERS_COLUMNS = ("comm_id", "transfer_ns")


def own_ns(kind: np.ndarray, device_ns: np.ndarray, cpu_ns: np.ndarray) -> np.ndarray:
    """Each event's own time on the clock the rules take it from: ``cpu_ns`` for waits, ``device_ns`` for
    every other event (-1 where that clock measured nothing)."""
    return np.where(np.asarray(kind) == K_WAIT, cpu_ns, device_ns).astype(np.int64)


def bare_graph(
    kind: np.ndarray,
    comm: np.ndarray,
    wait_op: np.ndarray,
    own: np.ndarray,
    t_start_ns: np.ndarray,
    t_end_ns: np.ndarray,
    t_complete_ns: np.ndarray,
    n_comms: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(durations int64[n], transfer int64[m]) by the rules in the module docstring.

    `comm` and `wait_op` are dense indices (comm 0..m-1, event position), -1 where none; `own` is each
    event's own time (`own_ns`: compute and markers their device time, waits their CPU time).
    """
    span = np.maximum(t_end_ns - t_start_ns, 0)
    own = np.where(own >= 0, own, span)
    is_op = (kind == K_COLLECTIVE) | (kind == K_SEND) | (kind == K_RECV)
    durations = np.where(is_op, span, own)
    plain = (kind == K_COMPUTE) | (kind == K_MARKER) | (kind == K_WAIT)
    assert np.all(plain | is_op)
    durations = np.maximum(durations, 0).astype(np.int64)

    # last member's issue start per comm
    ops = np.flatnonzero(is_op)
    last_start = np.full(n_comms, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_start, comm[ops], t_start_ns[ops])
    # when each member saw the result: its wait's end, or the op's own completion stamp without a wait
    seen = np.full(len(kind), -1, dtype=np.int64)
    counts = kind[ops] != K_SEND  # a send completes locally: it says nothing about the transfer
    seen[ops[counts]] = t_complete_ns[ops[counts]]
    waits = np.flatnonzero(kind == K_WAIT)
    target = wait_op[waits]
    by_wait = kind[target] != K_SEND
    seen[target[by_wait]] = t_end_ns[waits[by_wait]]
    members = ops[seen[ops] >= 0]
    first_seen = np.full(n_comms, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_seen, comm[members], seen[members])
    known = first_seen != np.iinfo(np.int64).max
    transfer = np.zeros(n_comms, dtype=np.int64)
    transfer[known] = np.maximum(first_seen[known] - last_start[known], 0)
    return durations, transfer


def _read_table(path: Path, columns: tuple[str, str], what: str) -> pa.Table:
    if not path.is_file():
        raise ArtifactError(f"{path}: missing {what} table")
    table = read_parquet(path, versioned=False)
    found = (table.schema.metadata or {}).get(b"schema_version")
    if found is not None and found.decode() != schemas.SCHEMA_VERSION:
        raise ArtifactError(
            f"{path}: schema_version {found.decode()!r}, this prism reads {schemas.SCHEMA_VERSION!r}"
        )
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ArtifactError(f"{path}: lacks columns {missing}; a {what} table has columns {list(columns)}")
    for name in columns:
        if table.column(name).null_count:
            raise ArtifactError(f"{path}: column {name!r} has nulls")
    return table


def _by_id(path: Path, ids: np.ndarray, values: np.ndarray, graph_ids: np.ndarray, what: str) -> np.ndarray:
    """`values` reordered to `graph_ids` (sorted, unique); errors name the first offending id."""
    n = len(graph_ids)
    if len(ids) != n:
        raise ArtifactError(
            f"{path}: {len(ids)} rows for a graph of {n} {what}s: these {what} values belong to another "
            "graph (re-run the stage that wrote them for this job)"
        )
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(dup):
        raise ArtifactError(f"{path}: {what}_id {int(sorted_ids[dup[0]])} appears twice")
    if np.any(sorted_ids != graph_ids):
        unknown = np.setdiff1d(sorted_ids, graph_ids)
        where = f"{what}_id {int(unknown[0])} is not in the graph" if len(unknown) else (
            f"{what}_id {int(np.setdiff1d(graph_ids, sorted_ids)[0])} of the graph is missing"
        )
        raise ArtifactError(
            f"{path}: {where}: the table belongs to another graph (re-run the stage that wrote it for this job)"
        )
    out = values[order].astype(np.int64)
    neg = np.flatnonzero(out < 0)
    if len(neg):
        raise ArtifactError(f"{path}: {what}_id {int(graph_ids[neg[0]])} has a negative value {int(out[neg[0]])}")
    return out


def read_durations(path: str | Path, event_ids: np.ndarray) -> np.ndarray:
    """int64 durations in the order of `event_ids` (the graph's, sorted), from an ``event_id, duration_ns``
    table."""
    path = Path(path)
    table = _read_table(path, DURATIONS_COLUMNS, "durations")
    return _by_id(path, table.column("event_id").to_numpy(), table.column("duration_ns").to_numpy(),
                  event_ids, "event")


def read_transfers(path: str | Path, comm_ids: np.ndarray) -> np.ndarray:
    """int64 transfers in the order of `comm_ids` (the graph's, sorted), from a ``comm_id, transfer_ns``
    table."""
    path = Path(path)
    table = _read_table(path, TRANSFERS_COLUMNS, "transfers")
    return _by_id(path, table.column("comm_id").to_numpy(), table.column("transfer_ns").to_numpy(),
                  comm_ids, "comm")


def spent_span(kind: np.ndarray, durations: np.ndarray, t_start_ns: np.ndarray, t_end_ns: np.ndarray) -> np.ndarray:
    """`durations` with every compute segment and marker the longer of its wall span and its own time: what its
    rank spent there (the measured-run rule's, `measured_run`; the emulate stage's sandbox by the same,
    `substitute.substitute_measured`). Events without times (-1) keep their durations."""
    timed = (t_start_ns >= 0) & (t_end_ns >= 0)
    span = np.maximum(t_end_ns - t_start_ns, 0)
    spent = ((kind == K_COMPUTE) | (kind == K_MARKER)) & timed
    return np.where(spent, np.maximum(span, durations), durations)


def measured_run(
    kind: np.ndarray,
    comm: np.ndarray,
    wait_op: np.ndarray,
    own: np.ndarray,
    t_start_ns: np.ndarray,
    t_end_ns: np.ndarray,
    t_complete_ns: np.ndarray,
    n_comms: int,
    transfer: np.ndarray | None = None,
    issues: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(durations, transfer) of a run whose ranks ran for real on one clock each (a real run, a slice run):
    what each event cost the way the run spent it, in the terms of the clock rule (`prism.clock_rule`).

    - compute: the longer of its wall span (``t_end_ns - t_start_ns``) and its device time: on CPU the rank
      spends the span, not only its thread's CPU time (the truths' compute spans are 1.017-1.067x their CPU
      time on the 16-core host: a rank is descheduled, waits on memory); on CUDA the GPU time of its kernels
      (from CUDA events), which a launch's host span does not show;
    - a marker: the same (the longer of its wall span and its own time): the rank spends the span too. A
      marker's CPU time is ~0.05 ms, but now and then its thread is off the CPU inside it for milliseconds
      (session 19: 25 of 111,680 markers of 91 truths over 1 ms, up to 5.9 ms, 23 of them ``bwd_end``; only
      that rank stopped, the host had idle cores): with its CPU time the sweep ran 2.1 and 2.6 % low on
      the two truths where one was on an iteration's critical path (`docs/results/fidelity/s19/model/`);
    - a comm's transfer: the *first* member's delay (last issue -> it saw completion: `bare_graph`'s
      rule), unless `transfer` gives it (several slice runs measure one comm);
    - a wait on a collective or a recv: its own time after the comm's completion on this run's clock,
      ``end - max(start, last issue + transfer)`` (`clock_rule.wait_own`): the member's lag behind the
      first member to see the completion, and its copy-out;
    - everything else as `bare_graph` (ops their issue span, waits on sends their own time).

    `own`, `comm`, `wait_op`, `n_comms` as for `bare_graph`; events of ranks this run did not measure hold
    -1 times (their durations are meaningless: the caller replaces them); `issues` = (comm, issue time) of
    members issued outside these events on the same clock (a timed slice run's replayed members).
    """
    from prism.clock_rule import wait_own

    durations, first = bare_graph(kind, comm, wait_op, own, t_start_ns, t_end_ns, t_complete_ns, n_comms)
    transfer = first if transfer is None else np.asarray(transfer, dtype=np.int64)
    durations = spent_span(kind, durations, t_start_ns, t_end_ns)
    is_op = (kind == K_COLLECTIVE) | (kind == K_SEND) | (kind == K_RECV)
    ops = np.flatnonzero(is_op & (t_start_ns >= 0))
    last_start = np.full(n_comms, np.iinfo(np.int64).min // 4, dtype=np.int64)
    np.maximum.at(last_start, comm[ops], t_start_ns[ops])
    if issues is not None and len(issues[0]):  # issues of members not among the events (a timed slice's replay)
        np.maximum.at(last_start, issues[0], issues[1])
    waits = np.flatnonzero((kind == K_WAIT) & (wait_op >= 0))
    target = wait_op[waits]
    blocking = kind[target] != K_SEND
    waits, target = waits[blocking], target[blocking]
    c = comm[target]
    durations[waits] = wait_own(t_start_ns[waits], t_end_ns[waits], last_start[c] + transfer[c])
    return durations.astype(np.int64), transfer
