# Validates the config against schemas/config.schema.yaml and holds the helpers the rules share.
import json
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from prism import config as prism_config
from prism import job_paths

if not workflow.overwrite_configfiles:
    # No --configfile: the default job (config/config.yaml, the same job as prism/configs/default.yaml), with any
    # --config KEY=VALUE on top. (A `configfile:` directive would deep-merge a user's --configfile into the
    # default job instead.)
    from snakemake.utils import update_config
    import yaml

    _job = yaml.safe_load(open(os.path.join(workflow.basedir, "..", "config", "config.yaml")).read())
    update_config(_job, dict(config))
    config.clear()
    config.update(_job)
validate(config, "../../schemas/config.schema.yaml")
JOB = prism_config.from_dict(dict(config), "config")
config.update(prism_config.with_defaults(dict(config)))  # the schema's defaults, as the stages see them
JOB_DIR = str(JOB.job_dir)


def foreign_run(job_dir):
    """Why `job_dir` cannot be this pipeline's job folder, or None. A folder holding another run (a `prism
    launch --out` folder: raw/ at its top, with its own run id) is refused before any job of the pipeline
    writes into it, which would overwrite that run's graph/ and then refuse "different runs" half-way."""
    raw = job_paths.raw_dir(job_dir)
    if not os.path.exists(raw):
        return None
    try:
        with open(job_paths.meta_path(job_dir)) as f:
            run = f"run {json.load(f).get('run_id', '?')}"
    except (OSError, ValueError):
        run = "a run"
    return (f"{job_dir} holds another run: {raw} ({run}) is what `prism launch --out {job_dir}` writes, not this "
            f"pipeline, which keeps its capture in {job_dir}/capture/; nothing was written. Fix: give this job "
            "another name (`job:` in the config, or --config job=NAME) or another `results:` folder, or move "
            f"{job_dir} away")


if foreign_run(JOB_DIR):
    raise WorkflowError(foreign_run(JOB_DIR))


def in_job(folder=None):
    """The job folder (or `folder` inside it) as a rule's param, from JOB_DIR: no rule rebuilds it from its outputs.
    A function, not a string: Snakemake's lint takes a path string that prefixes an output for a hard-coded one."""
    path = JOB_DIR if folder is None else f"{JOB_DIR}/{folder}"
    return lambda wildcards: path


def section(name):
    """The settings a stage needs, as JSON: passed to the stage and kept as the rule's params, so changing
    them re-runs that rule and what follows it, and changing other sections does not."""
    keep = {key: config[key] for key in ("job", "nproc", "workload", "device")}
    if name in config:
        keep[name] = config[name]
    return json.dumps(keep, sort_keys=True)


def measured_slices(wildcards, folder="slices"):
    """The events of every measured slice (`folder`: the untimed pass, or slices_timed): known once the
    slice_plan checkpoint has run."""
    from prism import artifacts

    plan = checkpoints.slice_plan.get().output[0]
    rows = artifacts.read_parquet(plan, columns=["slice", "measured"]).to_pylist()
    ks = sorted({r["slice"] for r in rows if r["measured"]})
    return [str(job_paths.slice_file(JOB_DIR, k, folder=folder)) for k in ks]


def emulate_options():
    """The emulate section as `prism emulate` options (quoted for the shell)."""
    import shlex

    e = JOB.emulate
    opts = [] if e.sandbox is None else ["--sandbox", e.sandbox]
    opts += [] if e.devices is None else ["--devices", str(e.devices)]
    opts += [] if e.steps is None else ["--steps", str(e.steps)]
    opts += [] if e.pruning else ["--no-pruning"]
    opts += [] if e.prefetch_mb is None else ["--prefetch-mb", str(e.prefetch_mb)]
    return " ".join(shlex.quote(o) for o in opts)


def final_targets():
    return stage_targets() + [f"{JOB_DIR}/prism.duckdb"]


def stage_targets():
    """What the pipeline produces for the job, before its catalog (the baseline's part: `baseline_targets`, an
    input function of its own, so a dry run shows the rest before the baseline is decided)."""
    targets = [f"{JOB_DIR}/summary.txt"]
    if JOB.emulate.wanted:
        targets.append(f"{JOB_DIR}/emulation/summary.txt")
    return targets


def baseline_summary(wildcards):
    return baseline_targets(wildcards, f"{JOB_DIR}/baseline/summary.txt")


def baseline_targets(wildcards, *paths):
    """`paths` when the baseline runs, else nothing. `baseline.run: auto` is decided where the baseline would run
    (the baseline_decision checkpoint, on the node that runs it), never on the host that submits the jobs;
    `never` needs no decision. The decision file itself is always a target, so the report can say why a baseline
    is missing."""
    if JOB.baseline.run == "never":
        return []
    decision = checkpoints.baseline_decision.get().output[0]
    with open(decision) as f:
        ran = json.load(f)["run"]
    return [decision, *paths] if ran else [decision]


# --- Where rules run: interpreter, threads and resources (issue 10). Kept apart from the config loading above. ---
# Every rule calls "$PY", the interpreter Snakemake itself runs in (a bare `python` on a cluster node is whatever the
# node's PATH finds first: not the venv's). Under `--sdm conda` a rule runs inside environment.yml's environment,
# where `python` is that environment's. $PY is set by the Snakefile's shell prefix (not a param, since moving the
# venv or switching to conda must not re-run finished stages).
import shlex
import sys

from snakemake.settings.types import DeploymentMethod

PY = "python" if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method else sys.executable
DEVICE = JOB.device  # cpu | cuda (the config's device key, default cpu)
ON_CUDA = DEVICE.startswith("cuda")
PY_SHELL = shlex.quote(PY)  # the Snakefile's shell.prefix sets PY to it


def stage_resources(stage):
    """Threads and resources of a stage, from the job config: what SLURM must reserve for it.

    Timing-critical stages (baseline, capture, slice runs, emulation) run alone on their node: the custom resource
    `timing_critical` (at most one at a time: profiles set `resources: timing_critical=1`) and SLURM's `--exclusive`.
    Locally they take every core Snakemake may use, so no other job shares the machine while they run.
    Override any value the Snakemake way: `--set-resources capture:mem_mb=64000`, `--set-threads capture=8`.
    """
    w = JOB.nproc
    p = JOB.capture.devices
    # ranks (processes) that compute at the same time, each on its own core (CPU) or device (CUDA)
    ranks = {"baseline_run": w, "baseline_decision": w, "capture": p, "slice_run": p, "emulate": JOB.emulate.devices or p}.get(stage)
    if ranks is None:  # analysis stages: polars/duckdb/numba over the job's tables
        return {"threads": 2, "mem_mb": 8000, "runtime": 60, "cpus_per_task": 2}
    if stage == "baseline_decision":  # asks for what the baseline run asks, so it lands where that one would
        return {"threads": w, "cpus_per_task": w, "mem_mb": 1000, "runtime": 5, **({"gpu": w} if ON_CUDA else {})}
    # a rank that computes holds ~0.5 GiB (torch's pages are shared with the zygote it forked from); capture and
    # slice runs also keep every other rank alive but asleep, at a few MiB each (DESIGN.md: <= 8 MiB private)
    mem_mb = 2000 + 512 * ranks + (16 * w if stage in ("capture", "slice_run", "emulate") else 0)
    res = {
        "threads": ranks,
        "cpus_per_task": ranks,
        "mem_mb": mem_mb,
        "runtime": 240,
        "timing_critical": 1,
        "slurm_extra": "--exclusive",
    }
    if ON_CUDA:
        res["gpu"] = ranks
    return res


def stage_threads(stage):
    """Threads of a stage's rule. A timing-critical one takes all of Snakemake's cores when they are set (local
    runs: nothing else runs beside it), at least what it needs; on a cluster its node is reserved whole."""
    need = stage_resources(stage)["threads"]
    cores = snakemake_cores()
    if "timing_critical" in stage_resources(stage) and cores is not None:
        return max(need, cores)
    return need


def snakemake_cores():
    """Snakemake's --cores (local runs, and a job's own Snakemake on a cluster node), None where unset (the
    submitting side of a cluster run: reading workflow.cores there raises)."""
    from snakemake.exceptions import WorkflowError

    try:
        cores = workflow.cores
    except WorkflowError:
        return None
    return cores if isinstance(cores, int) else None


def rule_resources(stage):
    """stage_resources without threads: what a rule's `resources:` takes."""
    return {k: v for k, v in stage_resources(stage).items() if k != "threads"}
