"""Running the pipeline as a user does, and comparing two runs' artifacts.

Snakemake runs with a PATH that does not hold the venv (as when the README's `.venv/bin/snakemake ...` is typed
without activating it): every rule must call the interpreter Snakemake runs in, never a bare `python`.

Two runs of the same inputs give the same artifacts, byte for byte, except the measured values listed in
MEASURED (the README's "Reproducibility" lists the same): wall-clock timings, CPU/device times, measured memory,
and the capture's scheduling statistics, which follow from timings. `differences` checks exactly that, so a
new measured column must be added here and documented, or the reproducibility tests fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tests.conftest import REPO, data_path, make_env

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", "workflow/Snakefile"]
VENV_BIN = str(Path(sys.executable).parent)

# table columns holding measured values (names are unique to the tables that hold them)
MEASURED_COLUMNS = {
    # events (raw PrismTrace, graph/, baseline/graph/, slices/slice=K/)
    "t_start_ns", "t_end_ns", "t_complete_ns", "cpu_ns", "device_ns", "mem_bytes", "mem_peak_bytes",
    "mem_reserved_bytes",
    # comms
    "t_first_start_ns", "t_last_start_ns", "t_last_end_ns",
    # calibrated/timeline, calibrated/iterations
    "start_ns", "end_ns", "duration_ns",
    # slices/transfers
    "transfer_ns",
    # slices/slice=K/replay_ops: when the replay server issued (t_complete_ns is above)
    "t_ready_ns", "t_issue_ns", "t_issued_ns",
    # emulation/memory: when the sandbox's marker was sampled
    "t_ns",
}
# keys of raw/meta.json holding measured values (run identity and timings; capture's scheduling statistics)
MEASURED_META_KEYS = {"run_id", "started", "wall_s", "capture", "t0_ns", "emulation",
                      "capture_dir"}  # capture_dir: where the job folder lies (a location, not a value)
# Parquet key-value metadata naming the run an artifact comes from (a new id every run)
RUN_ID_KEY = b"prism.run_id"
# whole files that are reports of measured values or binary catalogs rebuilt from the tables
MEASURED_FILES = {"summary.txt", "prism.duckdb", "capture_stats.json", ".snakemake_timestamp", "report.html",
                  "baseline-decision.json",  # the baseline's decision names the host and its cores
                  # which events bind an iteration's end, the sandbox's figures and the emulation's own delays
                  # follow the measured times
                  "critical_path.parquet", "figures.parquet", "delays.parquet"}


def path_without_venv() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                           if p and Path(p).resolve() != Path(VENV_BIN).resolve())


def snakemake_env(**extra: str) -> dict[str, str]:
    return make_env(PATH=path_without_venv(), **extra)


def snakemake(*args: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """`snakemake -s workflow/Snakefile ARGS` from the repository, its output captured."""
    return subprocess.run([*SNAKEMAKE, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env or snakemake_env())


def tiny_args(results: Path, profile: str = "profiles/local", *extra: str) -> list[str]:
    return ["--profile", profile, "--configfile", str(data_path("tiny.yaml")), "--config", f"results={results}",
            *extra]


def _table(path: Path) -> pa.Table:
    if path.suffix == ".parquet":
        return pq.read_table(path)
    with ipc.open_stream(pa.memory_map(str(path))) as reader:
        return reader.read_all()


def _compare_tables(rel: str, a: Path, b: Path) -> list[str]:
    ta, tb = _table(a), _table(b)
    meta_a, meta_b = ({k: v for k, v in (t.schema.metadata or {}).items() if k != RUN_ID_KEY} for t in (ta, tb))
    if ta.schema.remove_metadata() != tb.schema.remove_metadata() or meta_a != meta_b:
        return [f"{rel}: schemas differ:\n{ta.schema}\n--- vs ---\n{tb.schema}"]
    if ta.num_rows != tb.num_rows:
        return [f"{rel}: {ta.num_rows} rows vs {tb.num_rows}"]
    measured = [c for c in ta.column_names if c in MEASURED_COLUMNS]
    same_run = (ta.schema.metadata or {}).get(RUN_ID_KEY) == (tb.schema.metadata or {}).get(RUN_ID_KEY)
    if not measured and same_run and a.read_bytes() != b.read_bytes():
        return [f"{rel}: same values but not byte-identical (no measured column)"]
    return [f"{rel}: column {c!r} differs" for c in ta.column_names
            if c not in MEASURED_COLUMNS and not ta[c].equals(tb[c])]


def _compare_meta(rel: str, a: Path, b: Path) -> list[str]:
    ma, mb = (json.loads(p.read_text()) for p in (a, b))
    keys = (set(ma) | set(mb)) - MEASURED_META_KEYS
    out = [f"{rel}: {k!r} is {ma.get(k)!r} vs {mb.get(k)!r}" for k in sorted(keys) if ma.get(k) != mb.get(k)]
    if set(ma.get("capture", {})) != set(mb.get("capture", {})):
        out.append(f"{rel}: capture statistics differ in their keys")
    return out


def differences(a: Path, b: Path, under: tuple[str, ...] = ("",)) -> list[str]:
    """What differs between two job folders (under the given subfolders), measured values aside.

    logs/ and hidden files are not artifacts. Every other file must exist in both; tables (Parquet, Arrow
    streams) must have the same schema and rows and equal non-measured columns, and be byte-identical when they
    hold no measured column and no run id (the run id in a Parquet file's metadata differs by design, so such a file
    is compared by its values); raw meta.json the same non-measured keys; anything else byte-identical."""
    out = []
    for sub in under:
        files_a = {p.relative_to(a) for p in (a / sub).rglob("*") if p.is_file()}
        files_b = {p.relative_to(b) for p in (b / sub).rglob("*") if p.is_file()}
        for rel in sorted(files_a | files_b):
            if rel.parts[0] == "logs" or any(part.startswith(".") and part != ".snakemake_timestamp"
                                             for part in rel.parts):
                continue
            if rel not in files_a or rel not in files_b:
                out.append(f"{rel}: only in {a if rel in files_a else b}")
                continue
            fa, fb = a / rel, b / rel
            if rel.name in MEASURED_FILES:
                continue
            if rel.suffix in (".parquet", ".arrow"):
                out += _compare_tables(str(rel), fa, fb)
            elif rel.name == "meta.json":
                out += _compare_meta(str(rel), fa, fb)
            elif fa.read_bytes() != fb.read_bytes():
                out.append(f"{rel}: bytes differ")
    return out


def half_written(job: Path) -> list[str]:
    """Leftovers of an interrupted stage: temp files (`*.tmp*`) and staging folders (`.raw.old-*`, `.slice=K.run`)."""
    return sorted(str(p.relative_to(job)) for p in job.rglob("*")
                  if ".tmp" in p.name or (p.name.startswith(".") and (".old" in p.name or p.name.endswith(".run"))))


def processes_mentioning(text: str) -> list[str]:
    """`pid cmdline` of live processes whose command line contains text (orphans of a killed run)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(f"{proc.name} {cmd[:200]}")
    return found
