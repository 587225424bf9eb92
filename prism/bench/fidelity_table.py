"""The fidelity bench's configs and results: the reference model, one record per config, its JSON form, the Markdown table and the means.

The JSON (``fidelity.json``, a list of records) is the bench's raw result and the only input of its
tables: ``prism bench fidelity --summarize FILE ...`` prints the tables and means of committed JSON files
and runs nothing, so every figure in docs/fidelity.md can be recomputed from ``docs/results/fidelity/*.json``.

A record: ``config, world, devices, layout`` (the config), ``truth_ms`` (each truth run's iteration time),
``pred_ms`` / ``bare_ms`` (each prism run's prediction, calibrated from its slice runs / from the bare
graph), ``events`` (per-event errors of the first prism run against the first truth run), ``stage_s``,
``error``, ``pred_untimed_ms`` / ``truth_rank_ms`` / ``emulated`` (the first-pass prediction, per-rank
truth, the emulated sandbox: `prism/bench/fidelity_sandbox.py`; absent from older files), and ``scored`` (``{"at": UTC time, "commit": prism's git commit or null}``: which prism computed
``pred_ms``; written since the rescore became part of the record, absent from older files).

Per config: truth ms = median of ``truth_ms``; spread = their min-max; prism ms = median of ``pred_ms``
(all prism runs; their min-max in the last column); error % = (prism - truth) / truth; in spread =
prism inside the truth's min-max.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from prism.bench import fidelity_sandbox


class ResultsError(Exception):
    """A results file that cannot be read; the message names the file and the fix."""


# the bench's reference model (`prism.workloads.moe_gpt`), and the smoke test's
MODEL = ["--hidden", "128", "--ffn-hidden", "256", "--seq-len", "64", "--layers", "4", "--heads", "4",
         "--kv-heads", "2", "--experts", "4", "--micro-batch-size", "2", "--device", "cpu"]
SMALL_MODEL = ["--hidden", "64", "--ffn-hidden", "128", "--seq-len", "32", "--layers", "2", "--device", "cpu"]


@dataclass(frozen=True)
class Config:
    name: str
    world: int
    layout: tuple[str, ...]
    devices: int  # default P for this config

    def args(self, steps: int, model: list[str]) -> list[str]:
        return list(self.layout) + model + ["--steps", str(steps)]


@dataclass
class Result:
    cfg: Config
    p: int
    truth_ms: list[float] = field(default_factory=list)
    pred_ms: list[float] = field(default_factory=list)
    bare_ms: list[float] = field(default_factory=list)
    events: dict | None = None
    stage_s: dict = field(default_factory=dict)
    error: str | None = None
    scored: dict | None = None
    pred_untimed_ms: list[float] = field(default_factory=list)  # first pass (untimed slices), per prism run
    truth_rank_ms: list[list] = field(default_factory=list)  # per truth run: each rank's own iteration time
    emulated: list[dict] = field(default_factory=list)  # per prism run: the emulated sandbox (fidelity_sandbox)
    variant: list[str] = field(default_factory=list)  # per prism run, with --alternate: its variant ("none", a
    # slice load "full"/"mirror", "keep=DESC" a plan keeping those groups whole, joined by "+")

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.truth_ms) and bool(self.pred_ms)

    @property
    def truth(self) -> float:
        return statistics.median(self.truth_ms)

    @property
    def pred(self) -> float:
        return statistics.median(self.pred_ms)

    @property
    def bare(self) -> float:
        return statistics.median(self.bare_ms)

    def err(self, value: float) -> float:
        return 100.0 * (value - self.truth) / self.truth

    def inside(self) -> bool:
        return min(self.truth_ms) <= self.pred <= max(self.truth_ms)


# ------------------------------------------------------------------------------------------------ JSON


def to_record(r: Result) -> dict:
    record = {"config": r.cfg.name, "world": r.cfg.world, "devices": r.p, "layout": list(r.cfg.layout),
              "truth_ms": r.truth_ms, "pred_ms": r.pred_ms, "bare_ms": r.bare_ms, "events": r.events,
              "stage_s": r.stage_s, "error": r.error}
    if r.scored is not None:
        record["scored"] = r.scored
    if r.pred_untimed_ms or r.truth_rank_ms or r.emulated:
        record.update(pred_untimed_ms=r.pred_untimed_ms, truth_rank_ms=r.truth_rank_ms, emulated=r.emulated)
    if r.variant:
        record["variant"] = r.variant
    return record


def from_record(record: dict, known: dict[str, Config] | None = None) -> Result:
    cfg = (known or {}).get(record["config"]) or Config(record["config"], int(record["world"]),
                                                         tuple(record["layout"]), int(record["devices"]))
    return Result(cfg, int(record["devices"]), truth_ms=[float(x) for x in record["truth_ms"]],
                  pred_ms=[float(x) for x in record.get("pred_ms") or []],
                  bare_ms=[float(x) for x in record.get("bare_ms") or []], events=record.get("events"),
                  stage_s=record.get("stage_s") or {}, error=record.get("error"), scored=record.get("scored"),
                  pred_untimed_ms=[float(x) for x in record.get("pred_untimed_ms") or []],
                  truth_rank_ms=list(record.get("truth_rank_ms") or []), emulated=list(record.get("emulated") or []),
                  variant=[_variant_name(x) for x in record.get("variant") or record.get("slice_load") or []])


def _variant_name(x) -> str:
    """A prism run's variant as recorded (session 18's first three calls wrote it as "slice_load", the first
    one True for the full load, False for none)."""
    return {True: "full", False: "none"}.get(x, x) if isinstance(x, bool) else str(x)


def write_json(path: Path, results: list[Result]) -> None:
    """`path` holds the records of `results`, written whole (a temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps([to_record(r) for r in results], indent=1) + "\n")
    tmp.replace(path)


def read_json(path: Path, known: dict[str, Config] | None = None) -> list[Result]:
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file (a bench's --out DIR writes DIR/fidelity.json)")
    try:
        records = json.loads(path.read_text())
        if not isinstance(records, list):
            raise TypeError("not a list of records")
        return [from_record(rec, known) for rec in records]
    except (ValueError, TypeError, KeyError) as exc:
        raise ResultsError(f"{path}: not a fidelity results file ({type(exc).__name__}: {exc}); it must be the "
                           "fidelity.json a bench wrote") from None


# ----------------------------------------------------------------------------------------------- table

HEADER = ("| config | W | P | layout | truth ms | truth spread ms | prism ms | error % | in spread "
          "| ev start-in-iter err ms med/p95 | ev dur err ms med/p95 | aligned | bare ms | bare error % "
          "| prism runs: n, min-max ms |")
RULE = "|" + "---|" * 15


def row(r: Result) -> str:
    layout = " ".join(r.cfg.layout)
    if not r.ok:
        return (f"| {r.cfg.name} | {r.cfg.world} | {r.p} | {layout} | "
                f"FAILED: {(r.error or 'no measurement')[:300].replace('|', '/')} |")
    ev = r.events or {}
    bare = f"{r.bare:.2f} | {r.err(r.bare):+.1f}" if r.bare_ms else "- | -"
    return (f"| {r.cfg.name} | {r.cfg.world} | {r.p} | {layout} | {r.truth:.2f} | "
            f"{min(r.truth_ms):.2f}-{max(r.truth_ms):.2f} | {r.pred:.2f} | {r.err(r.pred):+.1f} | "
            f"{'yes' if r.inside() else 'no'} | {ev.get('start_med_ms', float('nan')):.2f}/"
            f"{ev.get('start_p95_ms', float('nan')):.2f} | {ev.get('dur_med_ms', float('nan')):.3f}/"
            f"{ev.get('dur_p95_ms', float('nan')):.3f} | {'yes' if ev.get('aligned') else 'NO'} | "
            f"{bare} | {len(r.pred_ms)}, {min(r.pred_ms):.2f}-{max(r.pred_ms):.2f} |")


def totals(results: list[Result]) -> list[str]:
    ok = [r for r in results if r.ok]
    if not ok:
        return ["no config succeeded"]
    e = [abs(r.err(r.pred)) for r in ok]
    worst = max(ok, key=lambda r: abs(r.err(r.pred)))
    lines = [
        f"configs: {len(ok)} of {len(results)} succeeded; prediction inside the truth's spread: "
        f"{sum(r.inside() for r in ok)} of {len(ok)}",
        f"calibrated from slices: mean |error| {statistics.mean(e):.1f} %, max {max(e):.1f} % ({worst.cfg.name})",
    ]
    with_bare = [r for r in ok if r.bare_ms]
    if with_bare:
        b = [abs(r.err(r.bare)) for r in with_bare]
        lines.append(f"bare graph (ablation):  mean |error| {statistics.mean(b):.1f} %, max {max(b):.1f} %")
    return lines


STAGES = ("truth", "truth-graphs", "capture", "graph+plan", "slices", "calibrate-untimed", "slices-timed", "emulate",
          "calibrate")


def stage_ranges(results: list[Result]) -> str:
    """Min-max over configs and runs of each stage's wall time (``stage_s``: ``truth<i>``, ``prism<i>-<stage>``, and
    ``truth-graphs``: every truth's graph, built after the config's runs; before it, ``truth<i>`` included its
    run's graph)."""
    seen: dict[str, list[float]] = {}
    for r in results:
        for key, seconds in r.stage_s.items():
            stage = "truth" if key[5:].isdigit() and key.startswith("truth") else \
                key.partition("-")[2] if key.startswith("prism") else key
            seen.setdefault(stage, []).append(float(seconds))
    parts = [f"{s} {min(seen[s]):.1f}-{max(seen[s]):.1f}" for s in STAGES if s in seen]
    return "stage wall times per run (s, min-max): " + (", ".join(parts) if parts else "not recorded")


def table(results: list[Result]) -> list[str]:
    return [HEADER, RULE] + [row(r) for r in results] + [""] + totals(results)


def summarize(paths: list[Path], known: dict[str, Config] | None = None) -> str:
    """The tables and means of results files: each file's, then (several files) all of them together."""
    every: list[Result] = []
    out: list[str] = []
    for path in paths:
        results = read_json(path, known)
        every += results
        scored = sorted({(r.scored or {}).get("commit") or "unrecorded" for r in results})
        out += [f"## {path} (predictions scored by: {', '.join(scored)})", ""] + table(results)
        out += [stage_ranges(results), ""]
        extra = fidelity_sandbox.table(results)
        if extra:
            out += ["### the emulated sandbox (and the first pass, where calibration was iterated once)", ""] + extra + [""]
    if len(paths) > 1:
        out += [f"## all {len(paths)} files together ({len(every)} configs)", ""] + totals(every)
        out += [stage_ranges(every)] + fidelity_sandbox.totals(every) + [""]
    return "\n".join(out)


def source_digest(root: Path | None = None) -> str:
    """A digest of the prism package's Python sources as they are on disk (every `prism/**/*.py`, by path and
    content): which code ran where the checkout's git metadata does not say (the device tool's copy of a working
    tree keeps an older `.git`, so its commit is not the tree's). `python -m prism.bench.fidelity --digest` prints
    it for this tree; `git stash; ...; git stash pop` or a checkout of a commit gives that commit's."""
    import hashlib

    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for path in sorted((root / "prism").rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def scored_by() -> dict:
    """Which prism computes a prediction: the UTC time, the git commit of this source tree (null outside
    a git checkout; ``+dirty`` with uncommitted changes) and `source_digest` (the sources themselves)."""
    at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "prism"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, ""
    return {"at": at, "commit": f"{commit}+dirty" if commit and dirty else commit, "digest": source_digest(root)}
