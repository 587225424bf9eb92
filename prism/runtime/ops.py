"""The table of collectives every transport reads: one entry per op a program can issue on a group.

`name` is the op as recorded (events' `op`, the payload keys, the replay plan); `method` the transport
method `PrismProcessGroup` calls (`Transport.call(method, ...)`); `backend` the torch `Backend` method with
the same arguments (the real transport's); `rooted`: the op has a root (`opts.rootRank`); `same_shape`:
every member contributes the same shape (the capture coordinator's mismatch check); `protocol`: the kind
of the emulate mode's pruned protocol that runs it (`emulate.pruned`). What an op computes is `semantics`.

Adding a collective: its entry here, its semantics, its `PrismProcessGroup` method (backend.py) and the
completion of each transport that moves data itself (capture, emulate) or replays it (slice's server).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    name: str
    method: str
    backend: str
    rooted: bool = False
    same_shape: bool = False
    protocol: str | None = None


COLLECTIVES: dict[str, Op] = {op.name: op for op in (
    Op("all_reduce", "allreduce", "allreduce", same_shape=True, protocol="all_reduce"),
    Op("all_reduce_coalesced", "allreduce_coalesced", "allreduce_coalesced", same_shape=True,
       protocol="all_reduce"),
    Op("all_gather", "allgather", "allgather", same_shape=True, protocol="all_gather"),
    Op("all_gather_into_tensor", "all_gather_single", "_allgather_base", same_shape=True, protocol="all_gather"),
    Op("all_gather_coalesced", "allgather_coalesced", "allgather_coalesced", protocol="all_gather"),
    Op("reduce_scatter", "reduce_scatter", "reduce_scatter", same_shape=True, protocol="reduce_scatter"),
    Op("reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", same_shape=True,
       protocol="reduce_scatter"),
    Op("all_to_all_single", "alltoall_base", "alltoall_base", protocol="all_to_all"),
    Op("all_to_all", "alltoall", "alltoall", protocol="all_to_all"),
    Op("broadcast", "broadcast", "broadcast", rooted=True, same_shape=True, protocol="broadcast"),
    Op("reduce", "reduce", "reduce", rooted=True, same_shape=True, protocol="reduce"),
    Op("gather", "gather", "gather", rooted=True, protocol="gather"),
    Op("scatter", "scatter", "scatter", rooted=True, protocol="scatter"),
    Op("barrier", "barrier", "barrier", protocol="barrier"),
)}

ROOTED = frozenset(op.name for op in COLLECTIVES.values() if op.rooted)  # (their methods have the same names)
SAME_SHAPE = frozenset(op.name for op in COLLECTIVES.values() if op.same_shape)
PROTOCOL = {op.name: op.protocol for op in COLLECTIVES.values() if op.protocol}
REDUCING = frozenset(name for name, kind in PROTOCOL.items() if kind in ("all_reduce", "reduce", "reduce_scatter"))
# transport method -> the torch Backend method, where the names differ
BACKEND_METHOD = {op.method: op.backend for op in COLLECTIVES.values() if op.backend != op.method}
