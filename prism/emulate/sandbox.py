"""Which ranks run for real: the ``--sandbox SPEC`` of `prism emulate`, resolved on ``graph/ranks.parquet``.

SPEC is a rank list (``3,17``) or coordinate specs separated by ``;`` (``pp=last,tp=0,dp=0;pp=0,tp=1``):
each selects the ranks whose coordinates (``tp``, ``pp``, ``dp``, ``ep``) all match; a value is a number,
``first`` or ``last`` (the smallest / largest value the job has). The default (no SPEC) is one rank of the
last pipeline stage: the smallest rank with the largest ``pp`` (rank order is TP fastest, then DP, so that is
tp=0, dp=0, ep=0 in the reference workload).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

COORDS = ("tp", "pp", "dp", "ep")


class SandboxError(ValueError):
    """A SPEC the job cannot satisfy; the message lists what exists."""


def _values(ranks: pa.Table, name: str) -> np.ndarray:
    return ranks.column(name).to_numpy().astype(np.int64)


def _rank_list(spec: str, world: int) -> list[int]:
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            r = int(part)
        except ValueError:
            raise SandboxError(f"--sandbox {spec!r}: {part!r} is neither a rank number nor a coordinate "
                               f"(write ranks as 3,17 or coordinates as pp=last,tp=0)") from None
        if not 0 <= r < world:
            raise SandboxError(f"--sandbox {spec!r}: rank {r} is out of range: the job has {world} ranks "
                               f"(0..{world - 1})")
        out.append(r)
    if not out:
        raise SandboxError(f"--sandbox {spec!r}: no rank given")
    return out


def _coordinate_spec(spec: str, ranks: pa.Table) -> list[int]:
    rank = _values(ranks, "rank")
    keep = np.ones(len(rank), dtype=bool)
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in COORDS:
            raise SandboxError(f"--sandbox {spec!r}: {part!r} is not a coordinate; coordinates are "
                               f"{', '.join(c + '=N|first|last' for c in COORDS)}")
        have = _values(ranks, key)
        present = sorted({int(v) for v in have if v >= 0})
        if not present:
            raise SandboxError(f"--sandbox {spec!r}: the job has no {key} dimension (graph/ranks.parquet derives "
                               f"no {key} coordinate); it has {_describe(ranks)}")
        if value in ("first", "last"):
            want = present[0] if value == "first" else present[-1]
        else:
            try:
                want = int(value)
            except ValueError:
                raise SandboxError(f"--sandbox {spec!r}: {key}={value!r}: a coordinate is a number, first or "
                                   "last") from None
            if want not in present:
                raise SandboxError(f"--sandbox {spec!r}: the job has no {key}={want}; its {key} values are "
                                   f"{present}")
        keep &= have == want
    chosen = sorted(int(r) for r in rank[keep])
    if not chosen:
        raise SandboxError(f"--sandbox {spec!r} matches no rank; the job has {_describe(ranks)}")
    return chosen


def _describe(ranks: pa.Table) -> str:
    parts = []
    for c in COORDS:
        vals = sorted({int(v) for v in _values(ranks, c) if v >= 0})
        if vals:
            parts.append(f"{c} in {vals}")
    return f"{ranks.num_rows} ranks" + (f" with {', '.join(parts)}" if parts else " and no coordinates")


def resolve(spec: str | None, ranks: pa.Table) -> list[int]:
    """The sorted, distinct sandbox ranks that SPEC names (see the module docstring)."""
    world = ranks.num_rows
    if world == 0:
        raise SandboxError("graph/ranks.parquet has no ranks: rebuild the graph (prism graph --job ...)")
    if spec is None or not spec.strip():
        pp = _values(ranks, "pp")
        rank = _values(ranks, "rank")
        return [int(rank[pp == pp.max()].min())]
    chosen: set[int] = set()
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        chosen.update(_coordinate_spec(part, ranks) if "=" in part else _rank_list(part, world))
    if not chosen:
        raise SandboxError(f"--sandbox {spec!r}: no rank given")
    return sorted(chosen)


__all__ = ["SandboxError", "resolve"]
