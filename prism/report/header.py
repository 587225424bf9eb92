"""The facts a reader checks first, at the top of the report: the job (W, layout, P, device, program and
arguments), where and when it was captured, and the prism that wrote the page; and why a section is missing
(the baseline's decision)."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

import prism
from prism import job as job_files


def capture_meta(job: Path) -> tuple[Path | None, dict]:
    """The capture's meta.json (the pipeline's capture/raw/, or raw/ of a `prism launch --out JOB`) and its keys."""
    for path in map(job_files.meta_path, job_files.capture_candidates(job)):
        if path.is_file():
            try:
                return path, json.loads(path.read_text())
            except (OSError, ValueError):
                return path, {}
    return None, {}


def layout(job: Path) -> str | None:
    """'TP2 x PP2 x DP4, EP2' from graph/ranks.parquet's coordinates (dimensions of size 1 left out)."""
    path = job_files.graph_file(job, "ranks")
    if not path.is_file():
        return None
    ranks = pl.read_parquet(path, columns=["tp", "pp", "dp", "ep"])
    sizes = {d: ranks.filter(pl.col(d) >= 0)[d].n_unique() for d in ("tp", "pp", "dp", "ep")}
    main = " × ".join(f"{d.upper()}{n}" for d, n in sizes.items() if d != "ep" and n > 1) or "one rank per group"
    return main + (f", EP{sizes['ep']}" if sizes["ep"] > 1 else "")


def _commit() -> str | None:
    """The checkout's commit, with "-dirty" when its tracked files differ from it (a copied or edited tree)."""
    root = Path(prism.__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=7",
                              "--exclude", "*"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def facts(job: Path, world: int) -> list[tuple[str, str]]:
    """(label, value) rows of the report's header."""
    path, meta = capture_meta(job)
    started = meta.get("started")
    when = (datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            if isinstance(started, (int, float)) else "unknown (no capture meta.json)")
    commit = _commit()
    rows = [
        ("W (logical ranks)", str(meta.get("world_size", world))),
        ("layout", layout(job) or "unknown (no graph/ranks.parquet)"),
        ("P (device slots of the capture)", str(meta.get("devices", "unknown"))),
        ("device", str(meta.get("device", "unknown"))),
        ("program", " ".join(meta.get("command", [])) or "unknown"),
        ("captured", f"{when} on {meta.get('hostname', '?')} (torch {meta.get('torch_version', '?')}, "
                     f"run {meta.get('run_id', '?')})"),
        ("prism", f"{prism.__version__}" + (f" (commit {commit})" if commit else "")),
        ("job folder", str(job.resolve())),
    ]
    if path is None:
        rows[3] = ("device", "unknown")
    return rows


def baseline_decision(job: Path) -> dict | None:
    """baseline-decision.json (the pipeline's `baseline.run` decision, made where the baseline would run), or None."""
    path = job / "baseline-decision.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["baseline_decision", "capture_meta", "facts", "layout"]
