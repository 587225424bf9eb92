"""Every module of prism builds a job's artifact paths through `prism.job_paths` (re-exported by the job facade
`prism.job`), not by spelling them out: one place says where the artifacts are, for the stages, the report,
the benchmarks and the runtime alike."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import prism

# folders and files of a job that prism.job_paths names (JOB/graph, JOB/capture/raw/rank=R/events.arrow, ...)
FOLDERS = {"graph", "capture", "raw", "calibrated", "calibrated_untimed", "slices", "slices_timed", "payloads",
           "report", "emulation", "baseline"}
PATHS_MODULE = "job_paths.py"  # the one module that spells them


def _artifact_name(node: ast.AST) -> bool:
    if isinstance(node, ast.IfExp):  # job / ("baseline/graph" if ... else "graph")
        return _artifact_name(node.body) or _artifact_name(node.orelse)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return any(v in FOLDERS or v.endswith((".parquet", ".arrow")) or v == "meta.json"
                   for v in node.value.split("/"))
    if isinstance(node, ast.JoinedStr):  # f"{name}.parquet", f"rank={r}"
        tail = node.values[-1] if node.values else None
        return isinstance(tail, ast.Constant) and str(tail.value).endswith((".parquet", ".arrow"))
    return False


def _joined_parts(node: ast.Call) -> list[ast.AST]:
    """The parts after the first that a path-joining call adds: os.path.join(a, b, ...), Path(a, b, ...),
    a.joinpath(b, ...); [] for any other call."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "joinpath":
        return list(node.args)
    if (isinstance(func, ast.Attribute) and func.attr == "join" and ast.unparse(func.value) == "os.path") \
            or (isinstance(func, ast.Name) and func.id in ("Path", "PurePath")):
        return list(node.args[1:])
    return []


def spelled_paths(path: Path) -> list[str]:
    """`x / "graph"`-like path joins with a job artifact's name in a module (by `/`, os.path.join, Path(a, b)
    or joinpath)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _artifact_name(node.right):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and any(_artifact_name(a) for a in _joined_parts(node)):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def prism_modules() -> list[Path]:
    """Every module of the package but `job_paths.py` (the runtime, the stages, the report, the benches)."""
    root = Path(prism.__file__).parent
    return [p for p in sorted(root.rglob("*.py")) if p.relative_to(root).as_posix() != PATHS_MODULE]


def test_every_module_takes_artifact_paths_from_job_paths():
    modules = prism_modules()
    assert len(modules) > 100 and any(p.parent.name == "runtime" for p in modules)  # the scan sees the package
    found = [c for p in modules for c in spelled_paths(p)]
    assert not found, found


def test_the_check_sees_a_spelled_out_path(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('a = job / "graph" / "events.parquet"\nb = graph / f"{name}.parquet"\n'
                      'c = job_files.graph_file(job, "events")\nd = job / "oom.json"\n'
                      'e = job / ("baseline/graph" if base else "graph")\nf = os.path.join(job, "slices", name)\n'
                      'g = Path(run, "raw")\nh = run.joinpath("capture")\ni = os.path.join(job, "oom.json")\n'
                      'j = Path("slices/plan.parquet")\n')
    # a: both joins; b; e; f; g; h. Not c (the facade), not d nor i (not a job artifact), not j (no join)
    assert sorted(int(line.split(":")[1]) for line in spelled_paths(module)) == [1, 1, 2, 5, 6, 7, 8]


def test_job_paths_is_neutral_and_the_facade_re_exports_it():
    """job_paths imports nothing of prism's, so the runtime (which may not import the analysis, nor so
    `prism.job`) shares it; `prism.job` offers every one of its names, so the analysis' callers keep working."""
    from prism import job, job_paths
    from tests.unit.test_runtime_layering import imported_modules

    root = Path(prism.__file__).parent
    assert {m.split(".")[0] for m in imported_modules(root / PATHS_MODULE)} <= {"__future__", "pathlib"}
    public = [n for n in vars(job_paths) if not n.startswith("_") and n not in ("annotations", "Path")]
    assert {"graph_file", "rank_stream", "meta_path", "SLICES"} <= set(public)
    assert [n for n in public if getattr(job, n, None) is not getattr(job_paths, n)] == []
    runtime_users = [p for p in (root / "runtime").rglob("*.py") if "prism.job_paths" in imported_modules(p)]
    assert len(runtime_users) >= 5, runtime_users


def workflow_paths() -> set[str]:
    """The job artifacts the workflow's rules declare, relative to the job folder: every f"{JOB_DIR}/<an artifact
    folder>/..." of workflow/ (Snakemake's {{k}} read as {k}; a folder given by a variable is left out)."""
    root = Path(prism.__file__).parent.parent / "workflow"
    found = set()
    for smk in [root / "Snakefile", *sorted((root / "rules").glob("*.smk"))]:
        for rel in re.findall(r'f"\{JOB_DIR\}/([^"]*)"', smk.read_text()):
            rel = rel.replace("{{", "{").replace("}}", "}").rstrip("/")
            if rel.split("/")[0] in FOLDERS:
                found.add(rel)
    return found


def test_the_workflow_declares_the_artifacts_where_job_paths_puts_them():
    """The rules' inputs and outputs stay Snakemake's plain strings; each is a path job_paths builds, so the two
    cannot drift apart (a folder renamed in job_paths fails here, naming the rule's path)."""
    from prism import job_paths as jp

    job = Path("JOB")
    built = [jp.graph_dir(job), jp.report(job), jp.slice_plan(job), jp.emulation(job), jp.raw_dir(jp.capture_dir(job)),
             jp.payloads_dir(jp.capture_dir(job)), jp.raw_dir(jp.baseline(job)), jp.graph_dir(jp.baseline(job)),
             jp.graph_file(jp.baseline(job)), jp.summary(jp.emulation(job)), jp.summary(jp.baseline(job)),
             *(jp.graph_file(job, n) for n in ("events", "comms", "groups", "ranks"))]
    for folder in (jp.CALIBRATED, jp.UNTIMED_CALIBRATION):
        built += [jp.calibrated(job, n, folder) for n in ("timeline", "iterations", "critical_path")]
    for folder in (jp.SLICES, jp.TIMED_SLICES):
        built += [jp.own_durations(job, folder), jp.slice_transfers(job, folder)]
        built += [jp.slice_file(job, "{k}", n, folder) for n in ("events.parquet", "replay.parquet",
                                                                  "replay_ops.parquet")]
    known = {path.relative_to(job).as_posix() for path in built}
    declared = workflow_paths()
    assert len(declared) >= 20, declared  # the scan reads the rules
    assert sorted(declared - known) == []
