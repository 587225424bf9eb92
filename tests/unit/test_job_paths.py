"""The stages build a job's artifact paths through the job facade (`prism.job`), not by spelling them out."""

from __future__ import annotations

import ast
from pathlib import Path

import prism

# folders and files of a job that prism.job names (JOB/graph, JOB/capture/raw/rank=R/events.arrow, ...)
FOLDERS = {"graph", "capture", "raw", "calibrated", "calibrated_untimed", "slices", "slices_timed", "payloads",
           "report", "emulation", "baseline"}
FACADE_USERS = ["slices/plan.py", "calibrate/from_slices.py", "calibrate/substitute.py", "summary.py",
                "emulate/inputs.py"]


def _artifact_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        v = node.value
        return v in FOLDERS or v.endswith((".parquet", ".arrow")) or v == "meta.json"
    if isinstance(node, ast.JoinedStr):  # f"{name}.parquet", f"rank={r}"
        tail = node.values[-1] if node.values else None
        return isinstance(tail, ast.Constant) and str(tail.value).endswith((".parquet", ".arrow"))
    return False


def spelled_paths(path: Path) -> list[str]:
    """`x / "graph"`-like path joins with a job artifact's name in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _artifact_name(node.right):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_stages_take_artifact_paths_from_the_job_facade():
    root = Path(prism.__file__).parent
    found = [c for name in FACADE_USERS for c in spelled_paths(root / name)]
    assert not found, found


def test_the_check_sees_a_spelled_out_path(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('a = job / "graph" / "events.parquet"\nb = graph / f"{name}.parquet"\n'
                      'c = job_files.graph_file(job, "events")\nd = job / "oom.json"\n')
    assert len(spelled_paths(module)) == 3  # a: both joins; b; not c (the facade), not d (not a job artifact)
