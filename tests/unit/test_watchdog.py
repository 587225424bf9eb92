"""The real-mode hang watchdog's pure parts: the timeout setting and the diagnosis text."""

from __future__ import annotations

import pytest

from prism.runtime import watchdog

GROUPS = {"0": ["default_pg", [0, 1, 2]], "1": ["tp", [0, 1]]}


def _state(rank: int, state: str, *waits) -> dict:
    return {"rank": rank, "state": state, "waits": [list(w) for w in waits], "last": {}, "groups": GROUPS,
            "idle_s": 3.0}


def test_timeout_setting():
    assert watchdog.timeout_from_env({}) == watchdog.DEFAULT_TIMEOUT_S
    assert watchdog.timeout_from_env({watchdog.ENV: "2.5"}) == 2.5
    assert watchdog.timeout_from_env({watchdog.ENV: "0"}) == 0
    for bad in ("soon", "-1", "nan"):
        with pytest.raises(ValueError, match=watchdog.ENV):
            watchdog.timeout_from_env({watchdog.ENV: bad})


def test_a_skipped_collective_is_named_like_capture_names_it():
    states = {
        0: _state(0, "stuck", ("0", "all_reduce", 1, -1, 0, "float32", "1024")),
        1: _state(1, "stuck", ("0", "all_reduce", 1, -1, 0, "float32", "1024")),
        2: _state(2, "stuck", ("0", "broadcast", 1, 0, 0, "float32", "16")),
    }
    text = watchdog.diagnose(states, 3, 2.0)
    assert text.splitlines()[0].startswith("no op completed on any rank for 2 s")
    assert text.splitlines()[1] == (
        "  collective mismatch at all_reduce #1 on default_pg[0,1,2] (ops differ: a rank skipped or reordered a "
        "collective on this group): ranks 0-1 wait with all_reduce float32[1024]; rank 2 waits with broadcast "
        "float32[16]")


def test_a_member_that_exited_is_named():
    states = {
        0: _state(0, "stuck", ("1", "all_reduce", 4, -1, 0, "bfloat16", "8x8")),
        1: _state(1, "exited"),
        2: _state(2, "exited"),
    }
    lines = watchdog.diagnose(states, 3, 60).splitlines()
    assert lines[1] == "  all_reduce #4 on tp[0,1]: rank 0 waits with bfloat16[8x8]; rank 1 has exited"
    assert lines[2] == "  finished ranks: 1-2"


def test_a_send_send_deadlock_is_one_line():
    states = {
        0: _state(0, "stuck", ("1", "send", -1, 1, 7, "float32", "8")),
        1: _state(1, "stuck", ("1", "send", -1, 0, 7, "float32", "8")),
    }
    lines = watchdog.diagnose(states, 2, 5).splitlines()
    assert lines[1:] == ["  rank 0 waits in send to rank 1 (tag 7) on tp[0,1] (float32[8]); rank 1 waits in send "
                         "to rank 0 (tag 7) on tp[0,1] (float32[8])"]


def test_a_recv_from_any_source_and_a_recv_from_an_exited_rank():
    states = {
        0: _state(0, "stuck", ("0", "recv_anysource", -1, -1, 3, "float32", "2")),
        1: _state(1, "stuck", ("0", "recv", -1, 2, 0, "int64", "4")),
        2: _state(2, "exited"),
    }
    lines = watchdog.diagnose(states, 3, 5).splitlines()
    assert lines[1] == "  rank 0 waits in receive from any rank (tag 3) on default_pg[0,1,2] (float32[2])"
    assert lines[2] == "  rank 1 waits in receive from rank 2 (tag 0) on default_pg[0,1,2] (int64[4]); rank 2 has exited"
