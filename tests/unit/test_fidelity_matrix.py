"""The matrix table of one method: only the chosen variant's runs, each config once, the goals' figures."""

import pytest

from prism.bench import fidelity_matrix
from prism.bench.fidelity_table import Config, Result, ResultsError, write_json


def _result(name: str, truth: list[float], pred: list[float], variant: list[str], sandbox: list[float]) -> Result:
    emulated = [{"rank": 1, "sandbox_ms": s, "pred_rank_ms": p} for s, p in zip(sandbox, pred)]
    return Result(Config(name, 2, ("--dp", "2"), 1), 1, truth_ms=truth, pred_ms=pred, variant=variant,
                  truth_rank_ms=[[t, t] for t in truth], emulated=emulated)


def test_only_the_chosen_variants_runs_are_scored(tmp_path):
    # the default runs: 102 and 98 -> median 100 against the truths' 100; the variant's 150 is left out
    a = _result("dp2", [90.0, 100.0, 110.0], [102.0, 150.0, 98.0], ["none", "rule=bytes", "none"],
                [103.53, 150.0, 98.0])
    write_json(tmp_path / "a.json", [a])
    lines = fidelity_matrix.report([tmp_path / "a.json"])
    row = next(line for line in lines if line.startswith("| dp2 "))
    assert "| 2 | 100.00 | +0.0 | yes | +2.0, -2.0 | +1.5, +0.0 | +3.5, -2.0 |" in row
    assert "mean signed error +0.0 %" in lines[-2] and "inside the truth's spread 1 of 1" in lines[-2]
    assert "within ±2 %: 2 of 2" in lines[-1] and "within ±3 %: 1 of 2" in lines[-1]
    other = fidelity_matrix.report([tmp_path / "a.json"], "rule=bytes")
    assert any("| 1 | 150.00 | +50.0 | no |" in line for line in other)


def test_runs_without_variants_are_the_defaults_and_a_config_twice_is_refused(tmp_path):
    b = _result("tp2", [100.0], [110.0], [], [110.0])
    write_json(tmp_path / "b.json", [b])
    write_json(tmp_path / "c.json", [b])
    assert any("| tp2 | 2 | 1 | 100.00 (100.00-100.00) | 1 | 110.00 | +10.0 | no |" in line
               for line in fidelity_matrix.report([tmp_path / "b.json"]))
    with pytest.raises(ResultsError, match="tp2 is in both"):
        fidelity_matrix.report([tmp_path / "b.json", tmp_path / "c.json"])
    assert fidelity_matrix.main([str(tmp_path / "b.json"), str(tmp_path / "c.json")]) == 2


def test_the_readmes_matrix_figures_are_what_the_committed_files_give():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = " ".join((root / "README.md").read_text().split())
    claim = re.search(r"mean signed error \*\*([+-][\d.]+) %\*\*, mean \|error\| \*\*([\d.]+) %\*\*, (\d+) of (\d+) "
                      r"inside the truth's spread.*?`python -m prism\.bench\.fidelity_matrix (docs/\S+)/call\{([^}]*)\}"
                      r"/fidelity\.json`", text)
    assert claim, "the README's session-19 matrix sentence"
    signed, mean_abs, inside, n, folder, calls = claim.groups()
    files = [root / folder / f"call{c}" / "fidelity.json" for c in calls.split(",")]
    out = "\n".join(fidelity_matrix.report(files))
    assert f"mean signed error {signed} %" in out and f"mean |error| {mean_abs} %" in out
    assert f"inside the truth's spread {inside} of {n}" in out and f"configs {n} " in out
