"""The house rules of the package's layout, checked on the source:

- the runtime knows no workload and no analysis stage: it runs any program and writes raw artifacts;
- a mode's folder of the runtime (`prism/runtime/<mode>/`) uses another mode's module through its public
  names only (what two modes share lives in `runtime/replay/` or the core, under public names);
- no import circle anywhere in `prism` (imports inside functions count: they only hide a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import prism
import prism.runtime

FORBIDDEN = ("prism.workloads", "prism.graph", "prism.calibrate", "prism.report", "prism.slices", "prism.bench",
             "prism.sql", "prism.summary", "prism.job")  # prism.job: the facade imports calibrate; use job_paths


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


# -- cross-mode private names ------------------------------------------------------------------------------
FOLDERS = {p.name for p in Path(prism.runtime.__file__).parent.iterdir() if (p / "__init__.py").is_file()}


def _folder(name: str) -> str:
    """The runtime folder (a mode's, or `replay`) a dotted name lies in; "" for the core and outside."""
    parts = name.split(".")
    return parts[2] if len(parts) >= 3 and parts[:2] == ["prism", "runtime"] and parts[2] in FOLDERS else ""


def private_uses(path: Path, folder: str) -> list[str]:
    """`_names` of another runtime folder's modules that the module at `path` (in `folder`) uses: imported
    from them, or read as attributes of a module imported from there."""
    found, aliases = [], {}
    tree = ast.parse(path.read_text())

    def foreign(name: str) -> bool:
        return _folder(name) not in ("", folder)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name.startswith("_") and foreign(node.module):
                    found.append(f"from {node.module} import {alias.name}")
                elif foreign(f"{node.module}.{alias.name}"):  # maybe a module: `from prism.runtime.slice import m`
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and foreign(alias.name):
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_runtime_folder_uses_another_ones_private_names():
    root = Path(prism.runtime.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        found += [f"{rel}: {use}" for use in private_uses(path, folder)]
    assert not found, found


def test_the_check_sees_a_private_import_across_modes(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from prism.runtime.slice.replay_server import _PollingStore, load_plan\n"
                      "from prism.runtime.emulate import works as w\n"
                      "from prism.runtime.emulate.pruned import _own_thing\n"
                      "x = w._STATS\n")
    assert private_uses(module, "launch") == ["from prism.runtime.slice.replay_server import _PollingStore",
                                              "from prism.runtime.emulate.pruned import _own_thing",
                                              "prism.runtime.emulate.works._STATS"]
    assert private_uses(module, "emulate") == ["from prism.runtime.slice.replay_server import _PollingStore"]


# -- import circles --------------------------------------------------------------------------------------------
def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (anywhere in its source), by dotted name."""
    paths = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        paths[".".join(parts)] = path
    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in paths and m != name and m.startswith(package)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_in_prism():
    root = Path(prism.__file__).parent
    assert circles(module_graph(root, "prism")) == []


def test_the_check_sees_a_circle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("import pkg.a\ndef g():\n    pass\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports into the circle, is not part of it
    assert circles(module_graph(pkg, "pkg")) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


# -- small modules --------------------------------------------------------------------------------------------
LINES = 500
# left to the clock-model work (issue 20 item 3), which splits them with the one clock model
OVER_FOR_NOW = {"calibrate/sweep.py", "bench/fidelity.py"}


def test_no_module_over_500_lines():
    root = Path(prism.__file__).parent
    over = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LINES}
    assert set(over) <= OVER_FOR_NOW, {k: v for k, v in over.items() if k not in OVER_FOR_NOW}
