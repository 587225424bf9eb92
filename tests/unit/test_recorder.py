"""The recorder: a recv from any source gets its sender once known, and its row waits in memory until then."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from prism import schemas
from prism.runtime.recorder import Recorder


def _read(rec: Recorder) -> list[dict]:
    with pa.OSFile(str(rec.dir / "events.arrow")) as source:
        return ipc.open_stream(source).read_all().to_pylist()


def _op(rec: Recorder, kind: str, op: str, work_id: int, peer: int = -1) -> None:
    rec.end(rec.begin(), kind, op, group="0", peer=peer, work_id=work_id)


def test_any_source_recv_row_waits_for_its_sender_across_a_flush(tmp_path):
    rec = Recorder(0, tmp_path)
    _op(rec, schemas.KIND_SEND, "send", 0, peer=3)
    _op(rec, schemas.KIND_RECV, schemas.OP_RECV_ANYSOURCE, 1)
    rec.await_peer(1)
    _op(rec, schemas.KIND_SEND, "send", 2, peer=1)
    rec.flush()  # only the rows before the unresolved recv are written
    rec.waited(2, sync=False)  # the buffered send is waited later: its row (shifted by the flush) is found
    rec.resolve_peer(1, 2)
    rec.close()
    rows = [r for r in _read(rec) if r["kind"] != schemas.KIND_COMPUTE]
    assert [(r["op"], r["peer"], r["work_id"]) for r in rows] == [
        ("send", 3, 0), (schemas.OP_RECV_ANYSOURCE, 2, 1), ("send", 1, 2)]
    assert [r["seq"] for r in _read(rec)] == list(range(len(_read(rec))))
    assert rows[0]["is_async"]  # never waited: flushed as async
    assert rows[2]["is_async"]  # waited after other events ran


def test_any_source_recv_never_completed_keeps_peer_minus_one(tmp_path):
    rec = Recorder(0, tmp_path)
    _op(rec, schemas.KIND_RECV, schemas.OP_RECV_ANYSOURCE, 0)
    rec.await_peer(0)
    rec.close()
    assert [(r["op"], r["peer"]) for r in _read(rec) if r["kind"] == schemas.KIND_RECV] == [
        (schemas.OP_RECV_ANYSOURCE, -1)]
