"""One clock per timeline artifact: `prism.schemas.check_timeline` (what every stage runs on what it writes) and
the emulation's computed rows placed on the clock of its live rows (`prism.emulate.outputs.one_clock`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from prism import artifacts, schemas
from prism.calibrate.sweep import Timeline
from prism.emulate.outputs import one_clock


def _table(rank, seq, start, end, stream=None, names=("start_ns", "end_ns")):
    cols = {"rank": pa.array(rank, pa.int32()), "seq": pa.array(seq, pa.int64()),
            names[0]: pa.array(start, pa.int64()), names[1]: pa.array(end, pa.int64())}
    if stream is not None:
        cols["stream"] = pa.array(stream, pa.int32())
    return pa.table(cols)


def test_a_sequence_in_order_passes_and_gaps_are_fine():
    assert schemas.timeline_problem(_table([0, 0, 0, 1], [0, 1, 2, 0], [0, 5, 9, 0], [5, 7, 9, 3])) is None
    # rows listed out of order are sorted by seq first
    assert schemas.timeline_problem(_table([0, 0], [1, 0], [5, 0], [7, 5])) is None


def test_an_overlap_is_named_by_rank_stream_and_seq():
    problem = schemas.timeline_problem(_table([0, 0, 1, 1], [0, 1, 0, 1], [0, 5, 0, 40], [10, 12, 50, 60]))
    assert problem.startswith("rank 0 stream 0 seq 1 starts 5 ns before seq 0 ends") and "two clocks" in problem


def test_streams_are_separate_sequences():
    table = _table([0, 0], [0, 1], [0, 2], [10, 5], stream=[0, 1])
    assert schemas.timeline_problem(table) is None
    assert "stream 0 seq 1" in schemas.timeline_problem(_table([0, 0], [0, 1], [0, 2], [10, 5], stream=[0, 0]))


def test_an_event_ending_before_it_starts():
    problem = schemas.timeline_problem(_table([0], [0], [10], [4], names=("t_start_ns", "t_end_ns")))
    assert "seq 0 ends 6 ns before it starts" in problem


def test_tables_that_are_not_timelines_are_not_checked():
    assert schemas.timeline_problem(pa.table({"rank": [0, 0], "start_ns": [0, 1], "end_ns": [5, 2]})) is None


def test_writing_a_timeline_with_two_clocks_writes_nothing(tmp_path):
    bad = _table([0, 0], [0, 1], [0, 5], [10, 12]).append_column("event_id", pa.array([0, 1], pa.int64()))
    with pytest.raises(artifacts.ArtifactError, match=r"timeline.parquet: not one clock per \(rank, stream\)"):
        artifacts.write_outputs(tmp_path / "calibrated", {"timeline": bad}, run_id="r")
    assert not (tmp_path / "calibrated").exists()
    with pytest.raises(artifacts.ArtifactError, match="nothing was written"):
        artifacts.write_parquet(bad, tmp_path / "t.parquet", schemas.TIMELINE, run_id="r")
    assert not list(tmp_path.iterdir())


def test_one_clock_moves_computed_rows_onto_the_live_ones():
    # rank 0: computed, replay, replay, computed, computed; rank 1 all computed
    # swept:   [0,10] [10,20] [20,30] [30,40] [40,45] | [0,7] [7,9]
    swept = Timeline(np.array([0, 10, 20, 30, 40, 0, 7]), np.array([10, 20, 30, 40, 45, 7, 9]),
                     np.zeros(0, np.int64), np.zeros(0, np.int64))
    source = np.array([0, 1, 1, 0, 0, 0, 0], dtype=np.int8)
    start, end = swept.start_ns.copy(), swept.end_ns.copy()
    start[1:3], end[1:3] = [14, 30], [30, 95]  # the replay ran late: ended 65 ns after its swept end
    s, e = one_clock(np.array([0, 5, 7]), source, swept, start, end)
    assert s.tolist() == [0, 14, 30, 95, 105, 0, 7] and e.tolist() == [10, 30, 95, 105, 110, 7, 9]
    table = _table([0, 0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 4, 0, 1], s, e)
    assert schemas.timeline_problem(table) is None
    # without it: the tail starts 65 ns before the replay's last event ends
    assert "starts 65 ns before" in schemas.timeline_problem(_table([0, 0, 0, 0, 0], [0, 1, 2, 3, 4], start[:5], end[:5]))


def test_one_clock_moves_the_head_earlier_when_the_live_part_began_early():
    swept = Timeline(np.array([0, 10, 20]), np.array([10, 20, 30]), np.zeros(0, np.int64), np.zeros(0, np.int64))
    start, end = np.array([0, 6, 20]), np.array([10, 18, 30])
    s, e = one_clock(np.array([0, 3]), np.array([0, 1, 0], np.int8), swept, start, end)
    assert s.tolist() == [-4, 6, 20] and e.tolist() == [6, 18, 30]
