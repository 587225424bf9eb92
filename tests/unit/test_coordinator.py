"""The capture coordinator as a pure state machine: slots, scheduling order, completion, diagnosis."""

import pytest

from prism.runtime.capture.coordinator import CaptureError, Coordinator


def arrive(c, rank, key, members, op="all_reduce", dtype="float32", shape="4", role="member"):
    return c.handle(rank, ("arrive", key, members, (op, dtype, shape, 16, role)))


def started(world, slots):
    c = Coordinator(world, slots)
    c.handle(0, ("group", "g", "dp", tuple(range(world))))
    grants = []
    for r in range(world):
        grants += c.handle(r, ("hello",))
    return c, grants


def test_at_most_p_ranks_hold_a_slot():
    c, grants = started(4, 2)
    assert [r for r, _ in grants] == [0, 1]
    assert {m[1] for _, m in grants} == {0, 1}
    assert sum(rs.state == "running" for rs in c.ranks) == 2


def test_a_waiting_rank_gives_its_slot_to_the_smallest_logical_time():
    c, _ = started(4, 1)
    key = ("c", "g", 0)
    arrive(c, 0, key, (0, 1, 2, 3))
    # rank 0 waits: ranks 1..3 are runnable with logical time 0; the lowest rank number breaks the tie
    out = c.handle(0, ("wait", [key], 500))
    assert out == [(1, ("go", 0, False))]
    arrive(c, 1, key, (0, 1, 2, 3))
    out = c.handle(1, ("wait", [key], 100))
    assert out == [(2, ("go", 0, False))]
    arrive(c, 2, key, (0, 1, 2, 3))
    assert c.handle(2, ("wait", [key], 300)) == [(3, ("go", 0, False))]
    arrive(c, 3, key, (0, 1, 2, 3))  # completes the collective: 0, 1, 2 become runnable
    out = c.handle(3, ("wait", [key], 50))
    # the slot goes to the smallest logical time: rank 3 (50), then 1 (100), 2 (300), 0 (500); rank 3's
    # result was there when it waited: its round trip is a pure context switch
    assert out == [(3, ("go", 0, True))]
    assert c.context_switches == 1  # rank 3 resumed after giving its slot back


def test_p2p_message_completes_when_sent():
    c, _ = started(2, 2)
    key = ("p", "g", 0, 1, 0, 0)
    arrive(c, 1, key, (0, 1), op="recv", role="recv")
    assert c.handle(1, ("wait", [key], 10)) == []
    assert c.ranks[1].state == "blocked"
    out = arrive(c, 0, key, (0, 1), op="send", role="send")
    assert out == [(1, ("go", 1, False))]


def test_files_are_released_when_every_reader_is_done():
    c, _ = started(2, 2)
    key = ("c", "g", 0)
    for r in (0, 1):
        arrive(c, r, key, (0, 1))
    c.handle(0, ("done", [key]))
    assert c.finished_keys == []
    c.handle(1, ("done", [key]))
    assert c.finished_keys == [key]


@pytest.mark.parametrize("second, words", [
    (dict(op="broadcast"), "ops differ: a rank skipped or reordered a collective on this group): ranks 0-1 "
                           "arrived with all_reduce float32[4]; rank 2 arrived with broadcast float32[4]"),
    (dict(shape="8"), "(sizes differ): ranks 0-1 arrived with float32[4]; rank 2 arrived with float32[8]"),
    (dict(dtype="float16"), "dtypes differ"),
])
def test_mismatched_collective_is_reported_when_all_arrived(second, words):
    c, _ = started(3, 3)
    key = ("c", "g", 7)
    arrive(c, 0, key, (0, 1, 2))
    arrive(c, 1, key, (0, 1, 2))
    with pytest.raises(CaptureError) as err:
        arrive(c, 2, key, (0, 1, 2), **second)
    assert words in str(err.value) and "all_reduce #7 on dp[0,1,2]" in str(err.value)


def test_mismatch_with_a_missing_member_is_part_of_the_hang():
    c, _ = started(3, 3)
    key = ("c", "g", 0)
    arrive(c, 0, key, (0, 1, 2))
    arrive(c, 1, key, (0, 1, 2), shape="8")
    c.handle(0, ("wait", [key], 0))
    c.handle(1, ("wait", [key], 0))
    c.handle(2, ("exit", 0))
    assert c.stuck()
    text = c.diagnose()
    assert "(sizes differ): rank 0 arrived with float32[4]; rank 1 arrived with float32[8]; rank 2 has exited" in text


def test_all_to_all_may_have_different_sizes():
    c, _ = started(2, 2)
    key = ("c", "g", 0)
    arrive(c, 0, key, (0, 1), op="all_to_all_single", shape="3")
    arrive(c, 1, key, (0, 1), op="all_to_all_single", shape="5")  # no CaptureError: uneven splits are legal
    assert c.keys[key].mismatch is None and c.keys[key].complete()
    assert c.completed_keys == 1
    # the same sizes on an all_reduce are a mismatch: the check above is the op's rule, not a blind spot
    other = ("c", "g", 1)
    arrive(c, 0, other, (0, 1), shape="3")
    with pytest.raises(CaptureError, match="sizes differ"):
        arrive(c, 1, other, (0, 1), shape="5")


def test_hang_diagnosis_names_group_op_sequence_shape_and_the_missing_rank():
    c, _ = started(4, 2)
    c.handle(0, ("group", "g2", "dp", (0, 2)))
    key7 = ("c", "g", 7)
    for r in (0, 1, 2):
        arrive(c, r, key7, (0, 1, 2, 3), shape="1024")
    key8 = ("c", "g", 8)
    arrive(c, 3, key8, (0, 1, 2, 3), op="broadcast", shape="16")
    for r in (0, 1):
        c.handle(r, ("wait", [key7], 0))
    c.handle(2, ("wait", [key7], 0))
    assert not c.stuck()  # rank 3 still runs
    c.handle(3, ("wait", [key8], 0))
    assert c.stuck()
    text = c.diagnose()
    assert "all_reduce #7 on dp[0,1,2,3]: ranks 0-2 arrived with float32[1024]" in text
    assert "rank 3 waits in broadcast #8 on dp[0,1,2,3]" in text


def test_exited_rank_is_named():
    c, _ = started(2, 1)
    key = ("c", "g", 0)
    arrive(c, 0, key, (0, 1))
    c.handle(0, ("wait", [key], 0))
    c.handle(1, ("exit", 0))
    assert c.stuck()
    assert "rank 1 has exited (code 0)" in c.diagnose()


def test_recv_never_sent_names_the_sender():
    c, _ = started(2, 2)
    key = ("p", "g", 0, 1, 5, 0)
    arrive(c, 1, key, (0, 1), op="recv", role="recv")
    c.handle(1, ("wait", [key], 0))
    c.handle(0, ("exit", 0))
    assert c.stuck()
    text = c.diagnose()
    assert "message #0 from rank 0 to rank 1 (tag 5)" in text and "rank 0 has exited" in text


def test_swap_policy_suspends_least_recently_run_to_make_room():
    from prism.runtime.capture.device_state import SwapPolicy

    p = SwapPolicy(slots=1, capacity_bytes=100)
    assert p.grant(0, 0, 60) == []
    assert p.grant(0, 1, 30) == []                    # 90 of 100: both resident
    assert p.grant(0, 2, 50) == [("suspend", 0)]      # rank 0 ran least recently
    assert p.grant(0, 1, 30) == []                    # still resident: nothing moves
    assert p.grant(0, 0, 60) == [("suspend", 2), ("resume", 0)]
    assert SwapPolicy(slots=2).grant(1, 5, 10**12) == []   # host memory: never


def test_coordinator_passes_device_decisions_and_keeps_cuda_ranks_on_their_slot():
    from prism.runtime.capture.device_state import SwapPolicy

    c = Coordinator(4, 2, policy=SwapPolicy(2, capacity_bytes=100), sticky=True)
    c.handle(0, ("group", "g", "dp", (0, 1, 2, 3)))
    grants = [g for r in range(4) for g in c.handle(r, ("hello",))]
    assert grants == [(0, ("go", 0, False)), (1, ("go", 1, False))]
    key = ("c", "g", 0)
    arrive(c, 0, key, (0, 1, 2, 3))
    # slot 0 frees: rank 2 (home slot 0) runs there, rank 3 (home slot 1) may not
    assert c.handle(0, ("wait", [key], 10, 80)) == [(2, ("go", 0, False))]
    arrive(c, 2, key, (0, 1, 2, 3))
    assert c.handle(2, ("wait", [key], 10, 80)) == []       # nothing may run on slot 0 yet
    arrive(c, 1, key, (0, 1, 2, 3))
    assert c.handle(1, ("wait", [key], 5, 10)) == [(3, ("go", 1, False))]
    assert c.device_actions == []                            # everything fits so far
    # the collective completes: slot 0 is free, rank 1 (logical 5) must wait for slot 1, so rank 0 runs
    assert arrive(c, 3, key, (0, 1, 2, 3)) == [(0, ("go", 0, False))]
    # ranks 0 and 2 hold 80 bytes each on slot 0 (capacity 100): rank 2 must leave before rank 0 runs
    assert c.device_actions == [("suspend", 2)]
    assert c.handle(3, ("wait", [key], 1, 10)) == [(3, ("go", 1, True))]


def test_any_source_recv_takes_the_first_unclaimed_message():
    c, _ = started(3, 3)
    specific = ("p", "g", 1, 0, 5, 0)
    arrive(c, 0, specific, (1, 0), op="recv", role="recv")           # rank 0 waits for rank 1's message
    any_key = ("a", "g", 0, 5, 0)
    arrive(c, 0, any_key, (0,), op="recv", role="recv")               # ... and for one from anyone
    c.handle(0, ("wait", [any_key], 0))
    assert c.ranks[0].state == "blocked"
    arrive(c, 1, specific, (1, 0), op="send", role="send")            # claimed by the specific recv
    assert c.keys[any_key].matched is None and c.file_moves == []
    from_two = ("p", "g", 2, 0, 5, 0)
    out = arrive(c, 2, from_two, (2, 0), op="send", role="send")
    assert c.keys[any_key].matched == from_two
    assert c.file_moves == [(from_two, any_key)]                       # the link renames the data file
    assert out == [(0, ("go", 0, False))]


def test_a_message_read_before_its_send_arrived_is_not_given_to_an_any_source_recv():
    """A recv whose file is already there reads it without waiting, so its "done" can reach the coordinator
    before the sender's "arrive": that message must not then look unclaimed (an any-source recv would be
    matched to it, its file already deleted: FileNotFoundError in the receiving rank)."""
    c, _ = started(2, 2)
    first = ("p", "g", 1, 0, 0, 0)
    arrive(c, 0, first, (1, 0), op="recv", role="recv")
    c.handle(0, ("done", [first]))
    assert c.finished_keys == []                                       # its file stays until the send arrives
    arrive(c, 1, first, (1, 0), op="send", role="send")
    assert c.finished_keys == [first] and first not in c.keys
    any_key = ("a", "g", 0, 0, 0)
    arrive(c, 0, any_key, (0,), op="recv", role="recv")
    assert c.keys[any_key].matched is None and c.file_moves == []
    second = ("p", "g", 1, 0, 0, 1)
    arrive(c, 1, second, (1, 0), op="send", role="send")
    assert c.keys[any_key].matched == second and c.file_moves == [(second, any_key)]


def test_any_source_recv_never_sent_is_diagnosed():
    c, _ = started(2, 2)
    key = ("a", "g", 1, 3, 0)
    arrive(c, 1, key, (1,), op="recv", role="recv")
    c.handle(1, ("wait", [key], 0))
    c.handle(0, ("exit", 0))
    assert c.stuck()
    assert "receive #0 from any rank by rank 1 (tag 3)" in c.diagnose()


def test_phases_mark_the_last_first_wait_and_the_exits(monkeypatch):
    clock = iter(range(100, 200))
    monkeypatch.setattr("prism.runtime.capture.coordinator.time.monotonic", lambda: float(next(clock)))
    c, _ = started(3, 3)
    key = ("c", "g", 0)
    for r in range(3):
        arrive(c, r, key, (0, 1, 2))
    c.handle(0, ("wait", [key], 7_000_000))
    c.handle(1, ("wait", [key], 5_000_000))
    assert "all_waited" not in c.marks  # rank 2 is still in its set-up
    c.handle(1, ("wait", [key], 9_000_000))  # a second wait of rank 1 is not a first one
    assert "all_waited" not in c.marks
    c.handle(2, ("wait", [key], 6_000_000))
    waited = c.marks["all_waited"]
    for r in range(3):
        c.handle(r, ("exit", 0))
    assert c.stats()["setup_cpu_s"] == 0.018  # the CPU at each rank's first wait: 7 + 5 + 6 ms
    assert c.marks["last_exit"] - c.marks["first_exit"] > 0
    phases = c.phases(waited - 4.0, c.marks["last_exit"] + 1.0)
    assert phases == {"hello": c.marks["all_hello"] - waited + 4.0, "setup": 4.0, "steps": c.marks["last_exit"] - waited,
                      "exits": c.marks["last_exit"] - c.marks["first_exit"], "close": 1.0}


def test_phases_that_did_not_end_are_none():
    c, _ = started(2, 2)
    c.handle(0, ("wait", [], 1))
    assert c.phases(0.0, 10.0) == {"hello": round(c.marks["all_hello"], 3), "setup": None, "steps": None,
                                   "exits": None, "close": None}
