"""The README runs: every `sh` block, as written, in order, from the root of a copy of the checkout (the tracked
tree, with this checkout's .venv, as after `make setup` in a fresh clone). A block whose first line is `# slow`
says how long it takes and is left out; the tiny job's pipeline (a slow block, `prism run --configfile
tests/data/tiny.yaml`) is the session's run of the same config (tests/workflow/conftest.py), copied to
results/tiny, so the blocks that query results/tiny run on it."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.workflow.runs import snakemake_env

pytestmark = pytest.mark.slow

BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text())


def test_the_readme_marks_its_slow_blocks_with_their_duration():
    found = blocks()
    assert len(found) >= 12
    slow = [b for b in found if b.startswith("# slow")]
    assert slow and all(re.match(r"# slow: .*(min|cluster)", b) for b in slow), slow
    assert not any("python -m prism." in b for b in found)  # the commands a user types: `prism ...`


def _clone(root):
    """The checkout's tracked files (what a clone holds), plus .venv, under root."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for rel in files.stdout.split("\0"):
        if rel and (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    (root / ".venv").symlink_to(REPO / ".venv")


@pytest.mark.timeout(2400)
def test_every_quick_block_runs_in_order(tiny_reference, tmp_path):
    root = tmp_path / "clone"
    root.mkdir()
    _clone(root)
    shutil.copytree(tiny_reference, root / "results" / "tiny", symlinks=True)
    ran = 0
    for block in blocks():
        if block.startswith("# slow"):
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=root, capture_output=True, text=True,
                              timeout=900, env=snakemake_env())
        assert proc.returncode == 0, f"README block failed ({proc.returncode}):\n{block}\n{proc.stdout[-3000:]}\n" \
                                     f"{proc.stderr[-5000:]}"
        ran += 1
    assert ran >= 10
    assert (root / "results" / "cap" / "emulation" / "summary.txt").is_file()
    assert (root / "results" / "tiny" / "export" / "calibrated.perfetto.json").is_file()
