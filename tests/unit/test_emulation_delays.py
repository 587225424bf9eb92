"""The emulation's own delay per op kind (prism.emulate.delays) on hand-made exchanges and sandbox arrivals."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from prism import artifacts, schemas
from prism.emulate import delays

MS = 1_000_000


def _exchanges(rows: list[tuple]) -> pa.Table:
    """(comm_id, op, iteration, completed, virtual arrival, transfer, calibrated completion or None), ns."""
    names = schemas.RAW_EXCHANGES.names
    return pa.Table.from_pylist([dict(zip(names, r)) for r in rows], schema=schemas.RAW_EXCHANGES)


def _events(rows: list[tuple]) -> pa.Table:
    """The emulation's events as the delays read them: (source, kind, comm_id, start_ns)."""
    source, kind, comm, start = zip(*rows)
    return pa.table({"source": pa.array(source).dictionary_encode(), "kind": pa.array(kind).dictionary_encode(),
                     "comm_id": pa.array(comm, pa.int64()), "start_ns": pa.array(start, pa.int64())})


# comm 1, all_reduce: virtual members last at 1 ms, the sandbox at 3 ms, transfer 1 ms -> model 4 ms, completed
#   at 4.5 ms: 0.5 ms late (against the virtual arrivals only, meta.json's vs_model, it would be 2.5 ms);
# comm 2, a message the sandbox sends at 8 ms to a replayed rank that posted its recv at 2 ms, transfer 0.5 ms
#   -> model max(2, 8 + 0.5) = 8.5 ms, completed at 9 ms: 0.5 ms late;
# comm 3, a message from a replayed rank (sent at 10 ms, transfer 1 ms) the sandbox receives, posted at 10.5 ms
#   -> model max(10.5, 10 + 1) = 11 ms, completed at 12 ms: 1 ms late;
# comm 4, all_reduce in iteration 2, done 0.2 ms before the model (its own virtual arrival 20 ms + 1 ms).
EXCHANGES = [
    (1, "all_reduce", 1, 4_500_000, 1 * MS, 1 * MS, 4 * MS),
    (2, "send/recv", 1, 9 * MS, 2 * MS, MS // 2, None),
    (3, "send/recv", 1, 12 * MS, 10 * MS, 1 * MS, 11 * MS),
    (4, "all_reduce", 2, 20_800_000, 20 * MS, 1 * MS, 20 * MS),
]
EVENTS = [
    ("sandbox", "collective", 1, 3 * MS), ("sandbox", "send", 2, 8 * MS), ("sandbox", "recv", 3, 10_500_000),
    ("sandbox", "collective", 4, 19 * MS), ("sandbox", "compute", -1, 0), ("sandbox", "wait", 1, 4 * MS),
    ("replay", "collective", 1, 50 * MS),  # a replayed rank's issue: not the sandbox's arrival
]


def test_each_exchange_is_late_against_the_model_for_every_members_arrival():
    late = delays.lateness(_exchanges(EXCHANGES), delays.sandbox_arrivals(_events(EVENTS)))
    assert list(late["op"]) == ["all_reduce", "send/recv", "send/recv", "all_reduce"]
    assert list(late["late_ns"]) == [MS // 2, MS // 2, 1 * MS, -200_000]
    assert list(late["iteration"]) == [1, 1, 1, 2]
    cal = late["vs_calibrated_ns"]
    assert cal[0] == MS // 2 and np.isnan(cal[1]) and cal[2] == 1 * MS and cal[3] == 800_000


def test_one_row_per_op_kind_with_its_distribution_and_its_lateness_per_iteration():
    late = delays.lateness(_exchanges(EXCHANGES), delays.sandbox_arrivals(_events(EVENTS)))
    table = delays.delays_table(late, [0, 1, 2, 3])
    assert table.schema.equals(schemas.EMULATION_DELAYS)
    rows = {r["op"]: r for r in table.to_pylist()}
    assert sorted(rows) == ["all_reduce", "send/recv"]
    ar, p2p = rows["all_reduce"], rows["send/recv"]
    assert ar["n"] == 2 and p2p["n"] == 2
    assert ar["late_median_ms"] == pytest.approx(0.15) and ar["late_mean_ms"] == pytest.approx(0.15)
    assert ar["late_max_ms"] == pytest.approx(0.5) and ar["late_p95_ms"] == pytest.approx(-0.2 + 0.95 * 0.7)
    assert p2p["late_median_ms"] == pytest.approx(0.75) and p2p["late_max_ms"] == pytest.approx(1.0)
    # summed per iteration over 1, 2, 3 (0 is the start-up, as in the figures), only what is past the model:
    # all_reduce 0.5 ms in iteration 1, the early one in 2 counts 0, none in 3: 0.5 / 3
    assert ar["late_ms_per_iteration"] == pytest.approx(0.5 / 3)
    assert p2p["late_ms_per_iteration"] == pytest.approx(1.5 / 3)
    # against the calibrated completion: only the exchanges that have one
    assert p2p["vs_calibrated_median_ms"] == pytest.approx(1.0) and ar["vs_calibrated_max_ms"] == pytest.approx(0.8)
    assert ar["iterations"] == [0, 1, 2, 3]


def test_one_iteration_has_no_lateness_per_iteration():
    late = delays.lateness(_exchanges(EXCHANGES[:1]), delays.sandbox_arrivals(_events(EVENTS)))
    row = delays.delays_table(late, [0]).to_pylist()[0]
    assert row["n"] == 1 and row["late_ms_per_iteration"] is None


def test_no_real_exchanges_is_an_empty_table_of_the_schema(tmp_path):
    out = tmp_path / "run"
    table = delays.from_launch(out, _events(EVENTS), [0, 1])  # no raw/replay/exchanges.arrow
    assert table.num_rows == 0 and table.schema.equals(schemas.EMULATION_DELAYS)
    path = out / "raw" / "replay" / "exchanges.arrow"
    path.parent.mkdir(parents=True)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, schemas.RAW_EXCHANGES) as writer:
        writer.write_table(_exchanges([]))
    assert delays.from_launch(out, _events(EVENTS), [0, 1]).num_rows == 0
    written = artifacts.write_outputs(tmp_path / "emulation", {"delays": table}, {"delays": schemas.EMULATION_DELAYS},
                                      run_id="r")
    back = artifacts.read_parquet(written[0])
    assert back.num_rows == 0 and back.schema.remove_metadata().equals(schemas.EMULATION_DELAYS)
    (line,) = delays.text_lines(back)
    assert line.endswith(delays.NO_EXCHANGES) and "not the program" in line


def test_the_summary_lines_carry_the_tables_numbers(tmp_path):
    path = tmp_path / "run" / "raw" / "replay" / "exchanges.arrow"
    path.parent.mkdir(parents=True)
    with pa.OSFile(str(path), "wb") as sink, ipc.new_stream(sink, schemas.RAW_EXCHANGES) as writer:
        writer.write_table(_exchanges(EXCHANGES))
    table = delays.from_launch(tmp_path / "run", _events(EVENTS), [0, 1, 2, 3])
    lines = delays.text_lines(table)
    assert "not the program" in lines[0] and "op kind" in lines[1] and "iterations 1, 2, 3" in lines[-1]
    for row, line in zip(table.to_pylist(), lines[2:]):
        assert line.split() == [row["op"], str(row["n"])] + [
            f"{row[k]:.2f}" for k in ("late_median_ms", "late_p95_ms", "late_max_ms", "late_ms_per_iteration")]


def test_an_exchange_without_the_sandboxs_issue_is_another_job():
    with pytest.raises(artifacts.ArtifactError, match="comm 2 .* no sandbox rank's issue"):
        delays.lateness(_exchanges(EXCHANGES[:2]), delays.sandbox_arrivals(_events(EVENTS[:1])))
