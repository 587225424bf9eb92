"""A rank's communication sequence, event by event, as a re-run (a slice run, an emulated sandbox) must repeat it
from the capture: what must be equal, where the first departure is, and how to name an event in an error."""

from __future__ import annotations

import pyarrow as pa

from prism import schemas

# What must be equal, event by event, between a rank's re-run and its capture (its communication).
SAME = ("kind", "op", "group_name", "group_seq", "peer", "tag", "bytes")


def sequence(table: pa.Table) -> list[tuple]:
    """The SAME columns of `table` (sorted by seq) as tuples of plain values. The peer of a receive from any source
    is left out (-1): a re-run may hear from another sender first than the capture did."""
    cols = []
    for name in SAME:
        col = table[name]
        if pa.types.is_dictionary(col.type):
            col = col.cast(pa.string())
        cols.append(col.to_pylist())
    peer, op = SAME.index("peer"), SAME.index("op")
    return [r[:peer] + (-1,) + r[peer + 1:] if r[op] == schemas.OP_RECV_ANYSOURCE else r for r in zip(*cols)]


def first_departure(got: list[tuple], want: list[tuple], prefix: bool = False) -> int | None:
    """Index of the first event where `got` departs from `want`, or None when they agree; `prefix`: `got` may stop
    early (a run of fewer steps) and still agree."""
    if prefix and len(got) < len(want):
        want = want[: len(got)]
    if got == want:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def describe(rows: list[tuple], i: int) -> str:
    """Event i of a sequence for an error message (`nothing` past its end)."""
    if i >= len(rows):
        return "nothing (the sequence ended)"
    return ", ".join(f"{n}={v}" for n, v in zip(SAME, rows[i]) if v not in (None, -1) or n == "kind")
