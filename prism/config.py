"""Job configuration: dataclasses loaded from YAML and validated against `schemas/config.schema.yaml`.

A user's config stands alone: the embedded default job (`prism/configs/default.yaml`) is used only when no
config is given, never merged into one. A key the user leaves out takes the default the schema declares
for it (`with_defaults`), nothing else.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from prism import settings


def _import_jsonschema():
    """jsonschema without its optional `iri` format checker. Where rfc3987-syntax is installed (Jupyter's
    jsonschema[format-nongpl] pulls it in), importing jsonschema imports it, and it builds a Lark grammar: ~2.5 s
    of CPU in every process that loads a config (each stage, each Snakemake run of the pipeline, each SLURM job
    twice). prism's schema checks no format; the block lasts only for this import, so rfc3987_syntax stays
    importable for anything else in the process."""
    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        import jsonschema
        return jsonschema
    sys.modules["rfc3987_syntax"] = None  # an import of it raises ImportError, which jsonschema skips
    try:
        import jsonschema
    finally:
        del sys.modules["rfc3987_syntax"]
    return jsonschema


jsonschema = _import_jsonschema()

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"
# The reference workload takes the job's device as `--device`; any other program reads PRISM_DEVICE (if at all).
REFERENCE_WORKLOAD = "prism.workloads.moe_gpt"


class ConfigError(Exception):
    """A config the user must fix: the message names the file, the key and the problem."""


@dataclass(kw_only=True, slots=True)
class WorkloadConfig:
    module: str | None = None
    script: str | None = None
    args: list[str] = field(default_factory=list)
    iteration_fn: str | None = None  # MODULE:QUALNAME: one iteration = one outermost call (prism.runtime.named_boundaries)
    microbatch_fn: str | None = None

    def command(self) -> list[str]:
        """The program part of a launch command: `-m MODULE ARGS` or `SCRIPT ARGS`."""
        head = ["-m", self.module] if self.module else [self.script]
        return head + self.args


@dataclass(kw_only=True, slots=True)
class BaselineConfig:
    run: str = "auto"
    pin: bool = True

    def wanted(self, nproc: int, cores: int | None = None) -> bool:
        cores = cores if cores is not None else len(os.sched_getaffinity(0))
        return self.run == "always" or (self.run == "auto" and nproc <= cores)


@dataclass(kw_only=True, slots=True)
class CaptureConfig:
    devices: int = 2
    payloads: bool = True


@dataclass(kw_only=True, slots=True)
class SlicesConfig:
    keep_whole: tuple[str, ...] = ()  # group descriptions kept whole in a slice (prism slices plan --keep-whole)
    plan_rule: str = "sync-first"  # the pairs merged first: sync-first or bytes (prism slices plan --rule)

    def __post_init__(self) -> None:
        self.keep_whole = tuple(self.keep_whole)


@dataclass(kw_only=True, slots=True)
class CalibrateConfig:
    timed_slices: bool = False  # a second slice pass timed by the first calibration (slices_timed/)


@dataclass(kw_only=True, slots=True)
class EmulateConfig:
    """The `emulate` section; `wanted` when the config has one (the pipeline then runs the stage)."""

    wanted: bool = False
    sandbox: str | None = None  # ranks or coordinates (prism.emulate.sandbox); None: the stage's default
    devices: int | None = None
    steps: int | None = None
    pruning: bool = True
    prefetch_mb: int | None = None


@dataclass(kw_only=True, slots=True)
class JobConfig:
    job: str
    nproc: int
    workload: WorkloadConfig
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    slices: SlicesConfig = field(default_factory=SlicesConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    emulate: EmulateConfig = field(default_factory=EmulateConfig)
    results: str = "results"
    device: str = "cpu"

    @property
    def job_dir(self) -> Path:
        return Path(self.results) / self.job

    def environment(self) -> dict[str, str]:
        """What a stage exports to the ranks it launches: the device the job runs on, and the boundary
        functions the workload names (the variables of prism.runtime.named_boundaries)."""
        env = {settings.DEVICE.name: self.device}
        if self.workload.iteration_fn:
            env[settings.ITERATION_FN.name] = self.workload.iteration_fn
        if self.workload.microbatch_fn:
            env[settings.MICROBATCH_FN.name] = self.workload.microbatch_fn
        return env


def args_to_list(args) -> list[str]:
    """`{tp: 2, var-seq: true}` -> ["--tp", "2", "--var-seq"]; a list is kept as it is."""
    if isinstance(args, list):
        return [str(a) for a in args]
    out: list[str] = []
    for key, value in (args or {}).items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def validate(raw: dict, source: str = "config") -> None:
    """Raise ConfigError naming the offending key if `raw` does not match the schema."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ConfigError(f"{source}: invalid value at '{key}': {err.message}")


# sections whose presence asks for a stage: never added by with_defaults (their keys get defaults when present)
OPTIONAL_SECTIONS = frozenset({"emulate"})


def with_defaults(raw: dict, node: dict | None = None) -> dict:
    """A copy of `raw` with every key the schema gives a default filled in where `raw` leaves it out
    (sections included: a missing `capture:` becomes its defaults). Nothing comes from the default job."""
    node = schema() if node is None else node
    out = dict(raw)
    for key, sub in node.get("properties", {}).items():
        if key not in out and key not in OPTIONAL_SECTIONS:
            if "default" in sub:
                out[key] = sub["default"]
            elif sub.get("type") == "object" and any("default" in p for p in sub.get("properties", {}).values()):
                out[key] = {}
        if isinstance(out.get(key), dict) and sub.get("type") == "object":
            out[key] = with_defaults(out[key], sub)
    return out


def _workload_args(wl: dict, device: str, source: str) -> list[str]:
    args = args_to_list(wl.get("args"))
    if wl.get("module") != REFERENCE_WORKLOAD:
        return args
    if "--device" not in args:
        return args + ["--device", device]
    given = args[args.index("--device") + 1] if args.index("--device") + 1 < len(args) else ""
    if given != device:
        raise ConfigError(f"{source}: workload.args gives device {given!r} but the job's 'device' is {device!r}: "
                          "set the top-level 'device' key only")
    return args


def _check_devices(job: JobConfig, source: str) -> None:
    if job.device != "cpu":
        return
    cores = len(os.sched_getaffinity(0))
    if job.capture.devices > cores:
        raise ConfigError(f"{source}: invalid value at 'capture.devices': {job.capture.devices} device slots, but "
                          f"this process may use {cores} core{'s' if cores != 1 else ''} (CPU affinity): set "
                          f"capture.devices to at most {cores}")


def from_dict(raw: dict, source: str = "config") -> JobConfig:
    validate(raw, source)
    raw = with_defaults(raw)
    wl = raw["workload"]
    job = JobConfig(
        job=raw["job"],
        nproc=raw["nproc"],
        results=raw["results"],
        device=raw["device"],
        workload=WorkloadConfig(module=wl.get("module"), script=wl.get("script"),
                                args=_workload_args(wl, raw["device"], source),
                                iteration_fn=wl.get("iteration_fn"), microbatch_fn=wl.get("microbatch_fn")),
        baseline=BaselineConfig(**raw["baseline"]),
        capture=CaptureConfig(**raw["capture"]),
        slices=SlicesConfig(**raw["slices"]),
        calibrate=CalibrateConfig(**raw["calibrate"]),
        emulate=_emulate(raw),
    )
    _check_devices(job, source)
    return job


def _emulate(raw: dict) -> EmulateConfig:
    section = dict(raw.get("emulate") or {})
    run = section.pop("run", True)
    return EmulateConfig(wanted="emulate" in raw and run, **section)


def load(path: str | Path | None = None) -> JobConfig:
    """Load and validate a job config (the embedded default when `path` is None)."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return from_dict(raw, str(path))


def add_job_arguments(parser) -> None:
    """`--configfile FILE` / `--config-json JSON`: how a stage is told its job. `--configfile` is the name `prism
    run` (Snakemake) gives the same file; `--config FILE`, the stages' first spelling, is kept as an alias."""
    parser.add_argument("--configfile", "--config", dest="config", type=Path, metavar="FILE",
                        help="job config YAML (default: the embedded default job); --config FILE is the same")
    parser.add_argument("--config-json", help="the job config as JSON (what the Snakefile passes)")


def from_arguments(args) -> JobConfig:
    """The job a stage was given with `add_job_arguments` (ConfigError if it is invalid)."""
    if getattr(args, "config_json", None):
        import json

        try:
            raw = json.loads(args.config_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config-json: not valid JSON: {exc}") from None
        return from_dict(raw, "--config-json")
    return load(getattr(args, "config", None))
