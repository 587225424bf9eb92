"""The communication sequence a re-run must repeat (slice runs and the emulated sandbox share it)."""

from __future__ import annotations

import pyarrow as pa

from prism import event_sequence, schemas


def _table(rows):
    names = event_sequence.SAME
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


SEND = ("comm", "send", "g1", 0, 1, 0, 64)
RECV_ANY = ("comm", schemas.OP_RECV_ANYSOURCE, "g1", 1, 3, 0, 64)
STEP = ("compute", "mm", None, -1, -1, -1, 0)


def test_the_same_sequence_has_no_departure():
    seq = event_sequence.sequence(_table([STEP, SEND]))
    assert event_sequence.first_departure(seq, list(seq)) is None


def test_the_first_differing_event_is_named():
    got = event_sequence.sequence(_table([STEP, SEND]))
    want = event_sequence.sequence(_table([STEP, SEND[:6] + (128,)]))
    assert event_sequence.first_departure(got, want) == 1
    assert event_sequence.describe(got, 1) == "kind=comm, op=send, group_name=g1, group_seq=0, peer=1, tag=0, bytes=64"
    assert event_sequence.describe(got, 2) == "nothing (the sequence ended)"


def test_a_shorter_run_departs_unless_a_prefix_is_allowed():
    got = event_sequence.sequence(_table([STEP]))
    want = event_sequence.sequence(_table([STEP, SEND]))
    assert event_sequence.first_departure(got, want) == 1
    assert event_sequence.first_departure(got, want, prefix=True) is None
    assert event_sequence.first_departure(want, got, prefix=True) == 1  # a longer run is never a prefix


def test_a_receive_from_any_source_may_hear_another_sender():
    other = RECV_ANY[:4] + (5,) + RECV_ANY[5:]
    got, want = (event_sequence.sequence(_table([r])) for r in (RECV_ANY, other))
    assert event_sequence.first_departure(got, want) is None
    send_to_other = SEND[:4] + (2,) + SEND[5:]
    got, want = (event_sequence.sequence(_table([r])) for r in (SEND, send_to_other))
    assert event_sequence.first_departure(got, want) == 0
