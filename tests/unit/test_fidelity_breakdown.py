"""prism.bench.fidelity_breakdown: per-kind sums on hand-computed values, and a folder that is no config."""

from pathlib import Path

import numpy as np
import pytest

from prism.bench import fidelity_breakdown as fb


def test_per_kind_ms_is_per_rank_iteration_after_iteration_0():
    kind = ["compute", "wait", "compute", "compute", "wait", "compute", "collective"]
    rank = [0, 0, 0, 1, 1, 1, 1]
    iteration = [0, 1, 2, 1, 1, 2, 2]
    dur_ns = [9_000_000, 1_000_000, 3_000_000, 2_000_000, 4_000_000, 5_000_000, 6_000_000]
    got = fb.per_kind_ms(kind, rank, iteration, dur_ns)
    # 2 ranks x 2 iterations (1, 2); iteration 0 left out
    assert got == pytest.approx({"compute": (3 + 2 + 5) / 4, "wait": (1 + 4) / 4, "collective": 6 / 4})


def test_per_kind_ms_without_later_iterations_is_empty():
    assert fb.per_kind_ms(["compute"], [0], [0], [5]) == {}


def test_a_folder_without_runs_is_one_error(tmp_path: Path, capsys):
    assert fb.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no truth0/graph" in err and str(tmp_path) in err


def test_the_committed_breakdown_is_what_the_committed_tables_give(tmp_path: Path):
    """docs/results/fidelity/logs/breakdown-device-4.txt (cited in docs/fidelity.md) from the committed tables."""
    import tarfile

    from tests.conftest import REPO

    with tarfile.open(REPO / "docs" / "results" / "fidelity" / "artifacts" / "device-4-tables.tar.xz") as tar:
        tar.extractall(tmp_path, members=[m for m in tar.getmembers() if m.name.startswith("./a/dp8-var/")],
                       filter="data")
    got = fb.breakdown(tmp_path / "a" / "dp8-var")[1:] + fb.ops(tmp_path / "a" / "dp8-var", 3)[1:]
    log = (REPO / "docs" / "results" / "fidelity" / "logs" / "breakdown-device-4.txt").read_text().splitlines()
    start = log.index("a/dp8-var")
    # the "sweep of truth0" line is the model's: the log predates session 9's clock rule (prism/clock_rule.py),
    # under which the same sweep gives another figure (docs/fidelity.md, "The model on the truth's own inputs")
    model = [i for i, line in enumerate(got[:9]) if "sweep of truth0" in line]
    assert len(model) == 1 and "sweep of truth0" in log[start + 1 + model[0]]
    keep = [i for i in range(9) if i != model[0]]
    assert [got[i] for i in keep] == [log[start + 1 + i] for i in keep]
    ops_at = [i for i, line in enumerate(log) if line == "a/dp8-var"][1]
    assert got[9:] == log[ops_at + 1:ops_at + 1 + len(got) - 9]
    assert "(truth0 itself 213.25 ms" in got[model[0]]
    # the method's rule first (exact on a real run's own inputs, docs/fidelity.md), then the pre-session-9 bare rule
    measured, bare = (float(got[model[0]].split(part)[1].split()[0]) for part in ("sweep of truth0", "the bare rule:"))
    assert abs(measured - 213.25) / 213.25 < 0.002 and abs(bare - 213.25) / 213.25 > 0.01


def test_rank_row_is_ms_per_iteration_after_iteration_0():
    kind = ["compute", "compute", "wait", "compute", "collective", "wait"]
    iteration = [0, 1, 1, 2, 2, 2]
    start = [0, 10_000_000, 14_000_000, 20_000_000, 26_000_000, 27_000_000]
    end = [9_000_000, 13_000_000, 15_000_000, 25_000_000, 27_000_000, 30_000_000]
    cpu = [8_000_000, 2_000_000, 0, 4_000_000, 0, 0]
    # iterations 1 and 2: compute CPU (2 + 4) / 2, wall (3 + 5) / 2, wait (1 + 3) / 2, collective 1 / 2
    assert fb.rank_row(kind, iteration, start, end, cpu) == pytest.approx(
        {"compute CPU": 3.0, "compute wall": 4.0, "wait": 2.0, "collective": 0.5})


def test_cpu_ratio_is_on_the_events_both_runs_have():
    assert fb.cpu_ratio({1: 10, 2: 30, 3: 60}, {2: 15, 3: 30, 9: 1000}) == pytest.approx(45 / 90)
    assert np.isnan(fb.cpu_ratio({1: 10}, {2: 5}))


def _events(path: Path, rank: int, cpu_ms: list[float], t0_s: float) -> None:
    """A rank's events: a compute then a wait an iteration (0, 1, 2), compute CPU `cpu_ms`, wall 1.1x."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"rank": [], "seq": [], "kind": [], "iteration": [], "t_start_ns": [], "t_end_ns": [], "device_ns": []}
    t = int(t0_s * 1e9)
    for k, ms in enumerate(cpu_ms):
        for j, (kind, cpu, wall) in enumerate((("compute", ms, 1.1 * ms), ("wait", 0.0, 2.0))):
            for name, v in (("rank", rank), ("seq", 2 * k + j), ("kind", kind), ("iteration", k),
                            ("t_start_ns", t), ("t_end_ns", t + int(wall * 1e6)), ("device_ns", int(cpu * 1e6))):
                rows[name].append(v)
            t += int(wall * 1e6)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), path)


def test_ranks_compares_every_source_with_truth0_per_rank(tmp_path: Path, capsys):
    d = tmp_path / "dp2"
    _events(d / "truth0" / "graph" / "events.parquet", 0, [5.0, 10.0, 10.0], 100.0)
    _events(d / "prism0" / "slices" / "slice=0" / "events.parquet", 0, [5.0, 8.0, 7.0], 200.0)
    _events(d / "prism0" / "slices" / "slice=1" / "events.parquet", 1, [5.0, 9.0, 9.0], 210.0)
    (d / "prism0" / "graph").mkdir()  # the capture graph: a config folder has one (--ranks reads only events)
    assert fb.main([str(d), "--ranks"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(d)
    rows = {(r.split(" | ")[0].strip("| "), r.split(" | ")[1]): r for r in out[3:]}
    # rank 0: truth0 compute CPU (10 + 10) / 2, wall 1.1x, wait 2 an iteration; the slices' 7.5 of it
    assert rows[("0", "truth0")] == "| 0 | truth0 | 100.0 | 10.00 | 11.00 | 2.00 | 0.00 | 1.000 |"
    assert rows[("0", "slices")] == "| 0 | slices | 200.0 | 7.50 | 8.25 | 2.00 | 0.00 | 0.750 |"
    # rank 1 is in no truth: no ratio; 'all' pools the events of the ranks truth0 has
    assert rows[("1", "slices")].endswith("| 9.00 | 9.90 | 2.00 | 0.00 | nan |")
    whole = [float(v) for v in rows[("all", "slices")].strip("| ").split(" | ")[2:]]
    assert whole == pytest.approx([200.0, (7.5 + 9) / 2, 1.1 * (7.5 + 9) / 2, 2.0, 0.0, 0.75], abs=0.006)
    assert ("all", "truth0") in rows and len(rows) == 5
