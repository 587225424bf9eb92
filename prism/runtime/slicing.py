"""Mode `slice`, rank side: the recorder that checks every communication op against the capture.

A slice rank must issue exactly the communication ops it issued in the capture: the replay server
answers from the capture, so a rank that diverges (another program or arguments, a nondeterministic
program) would otherwise hang waiting for an op no one replays, or exchange wrongly sized data.
`SliceRecorder` compares each op (kind, op, group, per-group sequence, peer, tag, bytes) with the rank's
captured op stream (`PRISM_CAPTURE/raw/rank=R/events.arrow`) as it is issued, and stops the rank at the
first difference with a message naming both.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from prism import schemas
from prism.runtime.recorder import Recorder

FIELDS = ("kind", "op", "group", "group_seq", "peer", "tag", "bytes")
_COMM = (schemas.KIND_COLLECTIVE, schemas.KIND_SEND, schemas.KIND_RECV)


class SliceDivergence(RuntimeError):
    """The slice rank issued another op than in the capture."""


def captured_ops(capture: Path, rank: int) -> list[tuple]:
    """The rank's communication ops in the capture, in program order: (kind, op, group, ..., bytes)."""
    path = Path(capture) / "raw" / f"rank={rank}" / "events.arrow"
    with pa.OSFile(str(path)) as source:
        table = ipc.open_stream(source).read_all()
    cols = {name: table[name].cast(pa.string()) if pa.types.is_dictionary(table[name].type) else table[name]
            for name in FIELDS + ("seq",)}
    rows = zip(*(cols[name].to_pylist() for name in FIELDS + ("seq",)))
    return [r for r in rows if r[0] in _COMM]


def _show(row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(FIELDS, row))


class SliceRecorder(Recorder):
    """A `Recorder` that stops the rank at its first op that differs from the capture."""

    def __init__(self, rank: int, out_dir: Path, capture: Path, device: str = "cpu") -> None:
        super().__init__(rank, out_dir, device=device)
        self._expected = captured_ops(capture, rank)
        self._next = 0

    def end(self, start, kind, op, group=None, group_seq=-1, peer=-1, tag=0, nbytes=0, dtype=None, shape=None,
            work_id=-1, mem=(-1, -1)) -> int:
        if kind in _COMM:
            got = (kind, op, group, group_seq, peer, tag, nbytes)
            i = self._next
            self._next += 1
            want = self._expected[i] if i < len(self._expected) else None
            if want is None or tuple(want[:-1]) != got:
                where = (f"its op #{i} (seq {want[-1]} in the capture) is [{_show(got)}] here but "
                         f"[{_show(want[:-1])}] in the capture" if want is not None else
                         f"it issued [{_show(got)}] after the {len(self._expected)} ops of its capture")
                raise SliceDivergence(
                    f"prism slice: rank {self.rank} diverged from its capture: {where}. The slice runs another "
                    "program or arguments than the capture, or the program is nondeterministic; capture again "
                    "with the same program")
        return super().end(start, kind, op, group=group, group_seq=group_seq, peer=peer, tag=tag, nbytes=nbytes,
                           dtype=dtype, shape=shape, work_id=work_id, mem=mem)
