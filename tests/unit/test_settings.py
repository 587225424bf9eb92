"""The `PRISM_*` variables in one typed table (`prism.settings`): read through it, documented from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from prism import settings
from tests.conftest import REPO

NAME = re.compile(r"\bPRISM_[A-Z0-9_]*[A-Z0-9]\b")
# starts every Python process of a run, before anything is imported: it reads PRISM_MODE itself
READS_ITS_OWN = {"prism/runtime/site/sitecustomize.py"}


def test_the_docs_table_is_generated_from_the_settings():
    assert (REPO / "docs" / "settings.md").read_text() == settings.table(), \
        "docs/settings.md is stale: python -m prism.settings > docs/settings.md"


def literal_names(path: Path) -> list[str]:
    """PRISM_* names a module spells as a bare string or a keyword (an environment lookup of its own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.keyword) and node.arg and NAME.fullmatch(node.arg):
            found.append(f"{node.lineno}: {node.arg}=")
    return found


def test_prism_reads_its_variables_through_the_settings():
    found = [f"{path.relative_to(REPO)}:{hit}" for path in sorted((REPO / "prism").rglob("*.py"))
             if path.name != "settings.py" and str(path.relative_to(REPO)) not in READS_ITS_OWN
             for hit in literal_names(path)]
    assert not found, found


def test_the_check_sees_a_lookup_of_its_own(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import os\nx = os.environ.get("PRISM_FOO")\nenv.update(PRISM_BAR="1")\n'
                      'msg = "set PRISM_DEVICE=cuda"\n')
    assert literal_names(module) == ["2: 'PRISM_FOO'", "3: PRISM_BAR="]


def test_every_variable_the_code_tests_and_scripts_name_is_in_the_table():
    """A variable renamed or dropped leaves no reader, setter or mention behind (scripts: outside comments)."""
    unknown = set()
    for folder in ("prism", "tests", "workflow", "scripts", "profiles"):
        for path in (REPO / folder).rglob("*"):
            if not path.is_file() or path.suffix not in (".py", ".sh", ".smk", ".yaml", ".md", "") \
                    or "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue
            lines = path.read_text(errors="replace").splitlines()
            if path.suffix in (".sh", ".yaml", ".smk"):
                lines = [line.split("#", 1)[0] for line in lines]
            unknown |= {f"{path.relative_to(REPO)}: {n}" for line in lines for n in NAME.findall(line)
                        if n not in settings.SETTINGS}
    assert not unknown, sorted(unknown)


def test_values_are_typed_and_a_bad_one_names_the_variable():
    env = {"PRISM_FORK_BATCH": "8", "PRISM_SLICE_RANKS": "0, 3,", "PRISM_PRUNING": "0", "PRISM_IMMORTAL": ""}
    assert settings.FORK_BATCH.get(env) == 8
    assert settings.SLICE_RANKS.get(env) == [0, 3] and settings.SLICE_RANKS.get({}) == []
    assert settings.PRUNING.get(env) is False and settings.PRUNING.get({}) is True
    assert settings.IMMORTAL.get(env) is True  # empty: the default
    assert settings.DEVICE.get({}) == "cpu" and settings.DEVICE.get({"PRISM_DEVICE": "cuda"}) == "cuda"
    with pytest.raises(ValueError, match="PRISM_RANK_MEMORY_BYTES='lots' is not an integer"):
        settings.RANK_MEMORY_BYTES.get({"PRISM_RANK_MEMORY_BYTES": "lots"})


def test_the_launcher_clears_what_it_sets_for_its_ranks():
    cleared = set(settings.launcher_clears())
    assert {"PRISM_MODE", "PRISM_OUT", "PRISM_PAYLOADS", "PRISM_SHM_DIR", "PRISM_CORES", "PRISM_CAPTURE",
            "PRISM_SLICE_RANKS", "PRISM_PRUNING", "PRISM_STATUS_DIR", "PRISM_PROGRESS_DIR",
            "PRISM_RANK_MEMORY_BYTES"} <= cleared
    assert not cleared & {"PRISM_DEVICE", "PRISM_HANG_TIMEOUT", "PRISM_FORK_BATCH", "PRISM_IMMORTAL"}  # the user's
