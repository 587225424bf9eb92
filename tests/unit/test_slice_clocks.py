"""A slice run's events must carry their clocks before they are written (`prism.slices.run.check_clocks`):
no negative CPU or device time, no end before its start, and on CUDA every compute event's GPU time
(calibration takes it as the event's duration); the error names the rank and the event."""

from __future__ import annotations

import pyarrow as pa
import pytest

from prism.slices.run import MismatchError, check_clocks


def _events(**edit) -> pa.Table:
    rows = {"seq": [0, 1, 2], "kind": ["compute", "collective", "wait"], "op": ["compute", "all_reduce", "wait"],
            "cpu_ns": [40, 900, 300], "device_ns": [9_000, 1_000, 2_000_000],
            "t_start_ns": [0, 100, 1_100], "t_end_ns": [100, 1_100, 2_001_100]}
    for name, (i, value) in edit.items():
        rows[name][i] = value
    return pa.table(rows)


def test_measured_clocks_pass_on_cpu_and_cuda():
    check_clocks(3, _events(), "cuda")
    check_clocks(3, _events(), "cpu")
    # on CPU a compute span that changed thread has no CPU time (-1), and so no device time: allowed
    check_clocks(3, _events(cpu_ns=(0, -1), device_ns=(0, -1)), "cpu")


@pytest.mark.parametrize("edit,device,why", [
    ({"device_ns": (0, -1)}, "cuda", r"GPU time"),
    ({"cpu_ns": (2, -5)}, "cuda", r"negative CPU time"),
    ({"device_ns": (1, -1_200_000_000)}, "cpu", r"negative device time"),
    ({"t_end_ns": (1, 50)}, "cpu", r"end before its start"),
])
def test_broken_clocks_name_the_rank_and_event(edit, device, why):
    with pytest.raises(MismatchError, match=rf"rank 3: slice event seq \d \(\w+ \w+\) has (a |an |no ){why}"):
        check_clocks(3, _events(**edit), device)


def test_the_first_broken_event_is_named_on_a_raw_stream_table():
    """The recorder's raw stream (dictionary-encoded kind/op, several chunks): the earliest event is named."""
    table = pa.concat_tables([_events(), _events(cpu_ns=(2, -3), device_ns=(0, -1))])
    table = table.set_column(0, "seq", pa.array(range(6)))
    for name in ("kind", "op"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table[name].dictionary_encode())
    with pytest.raises(MismatchError, match=r"rank 1: slice event seq 3 \(compute compute\) has no GPU time"):
        check_clocks(1, table, "cuda")
