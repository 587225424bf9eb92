"""The runtime knows no workload and no analysis stage: it runs any program and writes raw artifacts."""

from __future__ import annotations

import ast
from pathlib import Path

import prism.runtime

FORBIDDEN = ("prism.workloads", "prism.graph", "prism.calibrate", "prism.report", "prism.slices", "prism.bench",
             "prism.sql", "prism.summary")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_runtime_imports_no_workload_and_no_analysis():
    root = Path(prism.runtime.__file__).parent
    found = {
        f"{path.relative_to(root)}: {name}"
        for path in root.rglob("*.py")
        for name in imported_modules(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not found, sorted(found)


def test_the_check_sees_a_forbidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom prism import workloads\nfrom prism.workloads.moe_gpt import layout_error\n")
    assert {"prism.workloads", "prism.workloads.moe_gpt"} <= imported_modules(module)
