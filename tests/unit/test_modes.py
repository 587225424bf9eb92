"""The launch modes as records (`prism.runtime.modes`) and the zygote's typed spec."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import prism.runtime
from prism.runtime import modes
from prism.runtime.launch.zygote_spec import ZygoteSpec


def test_every_mode_names_parts_that_exist():
    for mode in modes.MODES.values():
        assert callable(modes._part(mode.transport)), mode.name
        if mode.replay:
            assert callable(modes._part(mode.replay_role)) and mode.replay_name, mode.name
    assert [n for n, m in modes.MODES.items() if m.device_slots] == ["capture", "emulate"]
    assert [n for n, m in modes.MODES.items() if m.watchdog] == ["real", "slice", "emulate"]  # slice, emulate: the ranks run for real
    assert [n for n, m in modes.MODES.items() if m.timed] == ["slice"]


def test_a_capture_is_known_by_its_meta():
    assert modes.captured({"mode": "capture"})
    assert not modes.captured({"mode": "slice"}) and not modes.captured({}) and not modes.captured({"mode": "x"})


def test_the_zygote_spec_round_trips_and_keeps_its_own_notes_out(tmp_path):
    spec = ZygoteSpec(nproc=4, run_id="r", status_dir=str(tmp_path), mode="slice", args=["--steps", "2"],
                      ranks=[0, 3], capture="/cap", timed=["g.parquet", "t.parquet"])
    spec.pids = {0: 123}
    spec.write(tmp_path / "spec.json")
    data = json.loads((tmp_path / "spec.json").read_text())
    assert "pids" not in data and data["ranks"] == [0, 3]
    back = ZygoteSpec.read(tmp_path / "spec.json")
    assert back.ranks == [0, 3] and back.args == ["--steps", "2"] and back.timed == ["g.parquet", "t.parquet"]
    assert back.pids == {} and back.prefetch_mb == 256 and back.rank_output == "pipes"


def test_a_spec_with_a_field_the_zygote_does_not_know_is_refused(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"nproc": 2, "run_id": "r", "status_dir": ".", "mode": "real",
                                                    "colour": "blue"}))
    with pytest.raises(ValueError, match="colour"):
        ZygoteSpec.read(tmp_path / "spec.json")


def mode_comparisons(path: Path) -> list[str]:
    """`x == "capture"`-like comparisons of a mode's name (a `modes.MODES` key) in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [o.value for o in operands if isinstance(o, ast.Constant) and o.value in modes.MODES]
        names += [e.value for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts
                  if isinstance(e, ast.Constant) and e.value in modes.MODES]
        if names and any("mode" in ast.unparse(o).lower() for o in operands):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_modes_compares_mode_names():
    """Not the runtime, nor the analysis that reads a run's meta.json (`modes.captured` says what a capture is)."""
    root = Path(prism.runtime.__file__).parent.parent
    found = [c for path in sorted(root.rglob("*.py")) if path.name != "modes.py" for c in mode_comparisons(path)]
    assert not found, found


def test_the_check_sees_a_mode_comparison(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('if spec.mode == "emulate" or mode.name in ("capture", "slice") or x == "real":\n    pass\n')
    assert len(mode_comparisons(module)) == 2
