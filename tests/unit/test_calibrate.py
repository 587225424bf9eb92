"""The calibrate sweep: numba discover and replay equal the plain-Python reference bit for bit, on random
and structured graphs, with and without pinned rows; hand-made graphs give the times the rules say; bad graphs
give clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from prism.calibrate import reference, stage
from prism.calibrate.arrays import Pins, SweepError
from prism.calibrate.sweep import Timeline, discover
from prism.calibrate.synthetic import Layout, from_programs, random_graph, training_graph

FIELDS = ("start_ns", "end_ns", "comm_start_ns", "comm_end_ns")


def assert_same(got: Timeline, want: Timeline) -> None:
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == np.int64 and b.dtype == np.int64
        assert np.array_equal(a, b), f"{name} differs at {np.flatnonzero(a != b)[:5]}"


def check_all_paths(syn, bundle: bool = True) -> Timeline:
    """discover, replay (same and new durations) against the reference; returns the reference timeline."""
    want = reference.sweep(syn.graph, syn.durations, syn.transfer)
    sched, got = discover(syn.graph, syn.durations, syn.transfer, bundle=bundle)
    assert_same(got, want)
    assert_same(sched.replay(syn.durations, syn.transfer), want)
    rng = np.random.default_rng(len(syn.durations))
    durations = rng.integers(0, 5000, syn.graph.n_events) * (rng.random(syn.graph.n_events) > 0.2)
    transfer = rng.integers(0, 20000, syn.graph.n_comms)
    out = Timeline.empty(syn.graph.n_events, syn.graph.n_comms)
    for _ in range(2):  # a second replay into the same buffers
        assert_same(sched.replay(durations, transfer, out=out), reference.sweep(syn.graph, durations, transfer))
    return want


# ------------------------------------------------------------------------------------ random graphs


@pytest.mark.parametrize("bundle", [True, False])
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("ranks,comms", [(1, 10), (2, 30), (5, 60), (12, 200)])
def test_random_graphs_match_reference(seed, ranks, comms, bundle):
    check_all_paths(random_graph(seed, ranks=ranks, comms=comms), bundle)


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_all_zero_durations_no_waits_and_only_p2p(seed):
    check_all_paths(random_graph(seed, ranks=4, comms=40, zero=1.0))
    check_all_paths(random_graph(seed, ranks=4, comms=40, no_wait=0.6, async_=0.3))
    check_all_paths(random_graph(seed, ranks=6, comms=40, p2p=1.0, async_=0.6))


@pytest.mark.parametrize("layout", [
    Layout(tp=2, pp=2, dp=4, ep=2, microbatches=4, layers=2, iterations=2, buckets=2),
    Layout(tp=1, pp=4, dp=2, ep=2, microbatches=6, layers=1, iterations=1, buckets=3),
    Layout(tp=2, pp=1, dp=4, ep=4, microbatches=2, layers=3, iterations=2, buckets=2),
    Layout(tp=4, pp=3, dp=1, ep=1, microbatches=5, layers=2, iterations=1, buckets=1),
    Layout(tp=1, pp=2, dp=1, ep=1, microbatches=1, layers=1, iterations=1, buckets=1),
], ids=lambda layout: f"tp{layout.tp}-pp{layout.pp}-dp{layout.dp}-ep{layout.ep}")
def test_training_graphs_match_reference(layout):
    syn = training_graph(layout, seed=layout.world)
    check_all_paths(syn)
    sched, _ = discover(syn.graph, syn.durations, syn.transfer)
    assert sched.bundled == (sched.n_bundles < layout.world)
    if layout.tp * layout.dp > 1:  # the identical ranks of a stage advance together
        assert sched.n_bundles == layout.pp


def test_training_graph_has_the_structure_it_claims():
    syn = training_graph(Layout(tp=2, pp=2, dp=4, ep=2, microbatches=4, layers=2, iterations=1, buckets=3))
    g = syn.graph
    kinds = np.bincount(g.kind, minlength=6)
    assert kinds[2] == kinds[3] > 0  # sends and recvs between the stages
    members = np.bincount(g.comm[g.comm >= 0], minlength=g.n_comms)
    assert set(members[~g.comm_p2p].tolist()) == {2, 4}  # TP/EP groups of 2, DP groups of 4
    waited = np.zeros(g.n_events, dtype=bool)
    waited[g.wait_op[g.wait_op >= 0]] = True
    ops = np.flatnonzero(np.isin(g.kind, [1, 2, 3]))
    assert (~waited[ops]).sum() == g.n_ranks  # one DP bucket per rank and step consumed without a wait


# ------------------------------------------------------------------------------------- pinned rows


def random_pins(syn, seed: int, share: float, prefix: bool = False) -> Pins:
    """Pinned rows around the unpinned timeline: up to 3 us early (so before their rank's previous end) or
    late; `prefix`: every rank's rows up to a random one (the emulation's tail pins so)."""
    g, rng = syn.graph, np.random.default_rng(seed)
    base = reference.sweep(g, syn.durations, syn.transfer)
    if prefix:
        cut = g.rank_ptr[:-1] + (rng.random(g.n_ranks) * (np.diff(g.rank_ptr) + 1)).astype(np.int64)
        rows = np.arange(g.n_events) < np.repeat(cut, np.diff(g.rank_ptr))
    else:
        rows = rng.random(g.n_events) < share
    start = base.start_ns + rng.integers(-3000, 3000, g.n_events)
    return Pins(rows, start, start + rng.integers(0, 2000, g.n_events))


def check_pinned_paths(syn, pins: Pins, bundle: bool = True) -> Timeline:
    """discover and replay (same inputs; new durations, transfers and pinned times) with `pins` against the
    reference; returns the reference timeline."""
    want = reference.sweep(syn.graph, syn.durations, syn.transfer, pins)
    sched, got = discover(syn.graph, syn.durations, syn.transfer, bundle=bundle, pins=pins)
    assert_same(got, want)
    assert_same(sched.replay(syn.durations, syn.transfer, pins=pins), want)
    rng = np.random.default_rng(len(syn.durations) + 1)
    n, m = syn.graph.n_events, syn.graph.n_comms
    durations, transfer = rng.integers(0, 5000, n), rng.integers(0, 20000, m)
    moved = Pins(pins.rows, pins.start_ns + rng.integers(0, 4000, n), pins.end_ns + 4000)
    assert_same(sched.replay(durations, transfer, pins=moved), reference.sweep(syn.graph, durations, transfer, moved))
    assert np.array_equal(want.start_ns[pins.rows], pins.start_ns[pins.rows])
    assert np.array_equal(want.end_ns[pins.rows], pins.end_ns[pins.rows])
    return want


@pytest.mark.parametrize("bundle", [True, False])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ranks,comms,share", [(1, 10, 0.5), (3, 40, 0.2), (6, 80, 0.4), (12, 200, 0.1)])
def test_random_graphs_with_pinned_rows_match_reference(seed, ranks, comms, share, bundle):
    syn = random_graph(seed, ranks=ranks, comms=comms)
    check_pinned_paths(syn, random_pins(syn, seed, share), bundle)
    check_pinned_paths(syn, random_pins(syn, seed, share, prefix=True), bundle)


@pytest.mark.parametrize("seed", range(3))
def test_training_graphs_with_pinned_prefixes_match_reference(seed):
    # identical ranks of a stage: the pinned lanes leave their bundle, the others keep advancing together
    syn = training_graph(Layout(tp=2, pp=2, dp=4, ep=2, microbatches=4, layers=2, iterations=2, buckets=2), seed)
    pins = random_pins(syn, seed, 0.0, prefix=True)
    pins.rows[syn.graph.rank_ptr[3] : syn.graph.rank_ptr[-1]] = False  # ranks 3.. computed: they bundle
    check_pinned_paths(syn, pins)
    sched, _ = discover(syn.graph, syn.durations, syn.transfer, pins=pins)
    assert sched.bundled


def test_a_pinned_issue_arrives_at_its_given_start_and_a_pinned_wait_waits_for_nothing():
    syn = from_programs([
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 1), ("compute", 4)],
        [("compute", 50), ("coll", "A", 2), ("wait", 1, 1), ("compute", 4)],
    ], transfer={"A": 5})
    rows = np.array([0, 1, 1, 0, 0, 0, 0, 0], bool)  # rank 0's issue (given at 70) and its wait (ends at 72)
    start, end = np.array([0, 70, 71, 0, 0, 0, 0, 0]), np.array([0, 71, 72, 0, 0, 0, 0, 0])
    t = check_pinned_paths(syn, Pins(rows, start, end))
    assert t.comm_start_ns.tolist() == [70] and t.comm_end_ns.tolist() == [75]  # the pinned issue came last
    assert t.start_ns.tolist() == [0, 70, 71, 72, 0, 50, 52, 76]
    assert t.end_ns.tolist() == [10, 71, 72, 76, 50, 52, 76, 80]  # rank 1 waits for 75; rank 0 did not wait


def test_a_recv_pinned_after_its_wait_started_still_bounds_the_completion():
    # rank 1's recv is given at 200, though the rows after it start at 5: the message completes at
    # max(recv issue 200, send issue 0 + 7), so the computed wait ends at 201 (clock_rule.p2p_done)
    syn = from_programs([
        [("send", "m", 1), ("wait", 0, 1)],
        [("compute", 3), ("recv", "m", 2), ("compute", 1), ("wait", 1, 1)],
    ], transfer={"m": 7})
    rows = np.array([0, 0, 0, 1, 1, 0], bool)
    start, end = np.array([0, 0, 0, 200, 4, 0]), np.array([0, 0, 0, 202, 5, 0])
    t = check_pinned_paths(syn, Pins(rows, start, end))
    assert t.start_ns[5] == 5 and t.end_ns[5] == 201
    assert t.comm_start_ns.tolist() == [200] and t.comm_end_ns.tolist() == [200]


def test_pins_are_checked_and_a_pinned_schedule_replays_with_the_same_rows():
    syn = random_graph(1, ranks=3, comms=20)
    pins = random_pins(syn, 1, 0.3)
    with pytest.raises(SweepError, match="pins.rows has shape"):
        discover(syn.graph, syn.durations, syn.transfer, pins=Pins(pins.rows[:-1], pins.start_ns, pins.end_ns))
    sched, _ = discover(syn.graph, syn.durations, syn.transfer, pins=pins)
    with pytest.raises(SweepError, match="replay it with pins"):
        sched.replay(syn.durations, syn.transfer)
    with pytest.raises(SweepError, match="differ from the rows"):
        sched.replay(syn.durations, syn.transfer, pins=Pins(~pins.rows, pins.start_ns, pins.end_ns))
    plain, _ = discover(syn.graph, syn.durations, syn.transfer)
    with pytest.raises(SweepError, match="discovered without pins"):
        plain.replay(syn.durations, syn.transfer, pins=pins)


# -------------------------------------------------------------------------------- hand-made graphs


def times(syn) -> tuple[list[int], list[int], list[int], list[int]]:
    t = check_all_paths(syn)
    return t.start_ns.tolist(), t.end_ns.tolist(), t.comm_start_ns.tolist(), t.comm_end_ns.tolist()


def test_sync_all_reduce_starts_when_the_last_member_arrives():
    syn = from_programs([
        [("compute", 10), ("coll", "A", 1), ("wait", 1, 1), ("compute", 4)],
        [("compute", 50), ("coll", "A", 2), ("wait", 1, 1), ("compute", 4)],
    ], transfer={"A": 5})
    start, end, cstart, cend = times(syn)
    assert cstart == [50] and cend == [55]  # rank 1 issued last, at 50
    assert end[:4] == [10, 11, 56, 60]  # rank 0's wait: max(11, 50 + 5) + its own 1 (clock_rule.wait_ends)
    assert end[4:] == [50, 52, 56, 60]
    assert start[2] == 11 and start[6] == 52


def test_recv_waits_for_a_late_send():
    syn = from_programs([
        [("compute", 100), ("send", "m", 3), ("wait", 1, 1)],
        [("recv", "m", 2), ("wait", 0, 1), ("compute", 10)],
    ], transfer={"m": 7})
    start, end, cstart, cend = times(syn)
    assert end[:3] == [100, 103, 104]  # the send completes locally
    assert end[3:] == [2, 108, 118]  # the recv completes at send issue (100) + transfer (7); own 1 after
    assert cstart == [100] and cend == [107]


def test_recv_posted_after_the_data_arrived_does_not_wait():
    syn = from_programs([
        [("send", "m", 1), ("wait", 0, 1)],
        [("compute", 500), ("recv", "m", 2), ("wait", 1, 3)],
    ], transfer={"m": 7})
    _, end, cstart, cend = times(syn)
    assert end[2:] == [500, 502, 505]
    assert cstart == [500] and cend == [500]  # max(recv issue, send issue + transfer)


def test_async_op_overlaps_compute():
    syn = from_programs([
        [("coll", "A", 1), ("compute", 100), ("wait", 0, 1)],
        [("coll", "A", 1), ("wait", 0, 1)],
    ], transfer={"A": 20})
    _, end, _, cend = times(syn)
    assert cend == [20]
    assert end[:3] == [1, 101, 102]  # the transfer is hidden behind the compute
    assert end[3:] == [1, 21]  # completion 20 + own 1


def test_op_without_wait_never_blocks():
    syn = from_programs([
        [("coll", "A", 5), ("compute", 3), ("marker", 1)],
        [("compute", 1000), ("coll", "A", 1), ("wait", 1, 1)],
    ], transfer={"A": 10})
    _, end, cstart, cend = times(syn)
    assert end[:3] == [5, 8, 9]
    assert end[3:] == [1000, 1001, 1011]
    assert cstart == [1000] and cend == [1010]


def test_zero_durations_and_empty_ranks():
    syn = from_programs([[], [("coll", "A", 0), ("wait", 0, 0)], [("coll", "A", 0), ("wait", 0, 0)], []])
    _, end, _, cend = times(syn)
    assert end == [0, 0, 0, 0] and cend == [0]


def test_lockstep_that_would_block_falls_back_to_rank_by_rank():
    # ranks 0 and 1 look alike and share collective A, so they form a bundle; but rank 0's wait at step 3
    # needs rank 1's send at step 4: in lockstep that blocks, rank by rank it does not. Ranks 3 and 4 form
    # a bundle that never blocks: it stays one.
    syn = from_programs([
        [("coll", "A", 1), ("wait", 0, 1), ("recv", "X", 1), ("wait", 2, 1), ("send", "Y", 1), ("compute", 1)],
        [("coll", "A", 1), ("wait", 0, 1), ("recv", "Z", 1), ("wait", 2, 1), ("send", "X", 1), ("compute", 1)],
        [("send", "Z", 5), ("compute", 3), ("recv", "Y", 1), ("wait", 2, 1), ("coll", "C", 1), ("wait", 4, 1)],
        [("compute", 2), ("coll", "B", 1), ("wait", 1, 3), ("coll", "C", 1), ("wait", 3, 1)],
        [("compute", 4), ("coll", "B", 2), ("wait", 1, 1), ("coll", "C", 1), ("wait", 3, 1)],
    ], transfer={"A": 10, "X": 7, "Z": 3, "Y": 2, "B": 4, "C": 1})
    sched, _ = discover(syn.graph, syn.durations, syn.transfer)
    assert sched.bundled and sched.lane_ptr.tolist() == [0, 1, 2, 3, 5]
    times(syn)


# ------------------------------------------------------------------------------------------- errors


def sweeps():
    return [
        ("numba", lambda s: discover(s.graph, s.durations, s.transfer)),
        ("numba-unbundled", lambda s: discover(s.graph, s.durations, s.transfer, bundle=False)),
        ("reference", lambda s: reference.sweep(s.graph, s.durations, s.transfer)),
    ]


@pytest.mark.parametrize("name,sweep", sweeps(), ids=lambda x: x if isinstance(x, str) else "")
def test_cycle_is_an_error_naming_ranks_and_events(name, sweep):
    syn = from_programs([
        [("compute", 1), ("recv", "a", 1), ("wait", 1, 1), ("send", "b", 1)],
        [("recv", "b", 1), ("wait", 0, 1), ("send", "a", 1)],
    ])
    with pytest.raises(SweepError, match="cycle") as err:
        sweep(syn)
    message = str(err.value)
    assert "rank 0 seq 2" in message and "wait on recv" in message and "rank 1 " in message


def test_cycle_through_collectives_names_the_group():
    syn = training_graph(Layout(tp=2, pp=1, dp=1, ep=1, microbatches=1, layers=2, iterations=1, buckets=1))
    g = syn.graph
    # rank 1 issues its two first TP all-reduces in the opposite order
    first = np.flatnonzero((g.kind == 1) & (np.arange(g.n_events) >= g.rank_ptr[1]))[:2]
    g.comm[first] = g.comm[first[::-1]].copy()
    with pytest.raises(SweepError, match="cycle") as err:
        discover(g, syn.durations, syn.transfer)
    assert "all_reduce on group 'tp'" in str(err.value)


def test_unmatched_comms_are_errors():
    syn = training_graph(Layout(tp=2, pp=2, dp=2, ep=2, microbatches=2, layers=1, iterations=1, buckets=1))
    op = int(np.flatnonzero(syn.graph.kind == 1)[3])
    syn.graph.comm[op] = -1
    for _, sweep in sweeps():
        with pytest.raises(SweepError, match="unmatched comm") as err:
            sweep(syn)
        assert f"seq {op - syn.graph.rank_ptr[syn.graph.rank_of(op)]}" in str(err.value)
    lonely = from_programs([[("send", "m", 1), ("wait", 0, 1)], [("recv", "n", 1), ("wait", 0, 1)]])
    with pytest.raises(SweepError, match="unmatched"):
        discover(lonely.graph, lonely.durations, lonely.transfer)


def test_bad_durations_are_errors():
    syn = random_graph(0, ranks=3, comms=10)
    with pytest.raises(SweepError, match="one per event"):
        discover(syn.graph, syn.durations[:-1], syn.transfer)
    durations = syn.durations.copy()
    durations[4] = -1
    with pytest.raises(SweepError, match="negative duration"):
        discover(syn.graph, durations, syn.transfer)
    sched, _ = discover(syn.graph, syn.durations, syn.transfer)
    with pytest.raises(SweepError, match="one per comm"):
        sched.replay(syn.durations, syn.transfer[:-1])


def test_schedule_layout_round_trips():
    syn = training_graph(Layout(tp=2, pp=2, dp=4, ep=2, microbatches=2, layers=1, iterations=1, buckets=1))
    sched, timeline = discover(syn.graph, syn.durations, syn.transfer)
    ids = np.arange(syn.graph.n_events, dtype=np.int64)
    laid = sched.to_schedule(ids)
    assert sorted(laid.tolist()) == ids.tolist()
    assert np.array_equal(sched.from_schedule(laid), ids)
    end_s, acc = sched.replay_scheduled(sched.to_schedule(syn.durations), sched.transfer_to_schedule(syn.transfer))
    assert np.array_equal(sched.from_schedule(end_s), timeline.end_ns)
    assert sched.nbytes > 0


def test_iterations_from_markers_or_the_iteration_column():
    syn = from_programs([
        [("compute", 5), ("marker", 1), ("compute", 7), ("marker", 2), ("compute", 100)],  # iteration_end x2
        [("compute", 3), ("compute", 4), ("compute", 6)],  # no markers: iterations 0, 0, 1
        [],
    ])
    g = syn.graph
    _, timeline = discover(g, syn.durations, syn.transfer)
    n = g.n_events
    job = stage.JobGraph(
        graph=g, event_ids=np.arange(n), rank=np.repeat([0, 1], [5, 3]).astype(np.int32),
        seq=np.r_[np.arange(5), np.arange(3)], iteration=np.array([0, 0, 1, 1, 2, 0, 0, 1], dtype=np.int32),
        iteration_end=np.array([0, 1, 0, 1, 0, 0, 0, 0], dtype=bool), comm_ids=np.arange(0), columns={},
    )
    rows = stage.iterations_table(job, timeline).to_pylist()
    assert [(r["rank"], r["iteration"], r["start_ns"], r["end_ns"], r["duration_ns"]) for r in rows] == [
        (0, 0, 0, 6, 6), (0, 1, 6, 15, 9), (1, 0, 0, 7, 7), (1, 1, 7, 13, 6)]
