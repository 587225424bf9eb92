"""prism.bench.fidelity_breakdown: per-kind sums on hand-computed values, and a folder that is no config."""

from pathlib import Path

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
