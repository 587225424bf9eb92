# Validates the config against schemas/config.schema.yaml and holds the helpers the rules share.
import json
import os

from snakemake.utils import validate

from prism import config as prism_config

if not workflow.overwrite_configfiles:
    # No --configfile: the embedded default job, with any --config KEY=VALUE on top. (A `configfile:`
    # directive would deep-merge a user's --configfile into the default job instead.)
    from snakemake.utils import update_config
    import yaml

    _job = yaml.safe_load(prism_config.DEFAULT_CONFIG.read_text())
    update_config(_job, dict(config))
    config.clear()
    config.update(_job)
validate(config, "../../schemas/config.schema.yaml")
JOB = prism_config.from_dict(dict(config), "config")
config.update(prism_config.with_defaults(dict(config)))  # the schema's defaults, as the stages see them
JOB_DIR = str(JOB.job_dir)


def section(name):
    """The settings a stage needs, as JSON: passed to the stage and kept as the rule's params, so changing
    them re-runs that rule and what follows it, and changing other sections does not."""
    keep = {key: config[key] for key in ("job", "nproc", "workload", "device")}
    if name in config:
        keep[name] = config[name]
    return json.dumps(keep, sort_keys=True)


def measured_slices(wildcards):
    """The events of every measured slice: known once the slice_plan checkpoint has run."""
    from prism import artifacts

    plan = checkpoints.slice_plan.get().output[0]
    rows = artifacts.read_parquet(plan, columns=["slice", "measured"]).to_pylist()
    ks = sorted({r["slice"] for r in rows if r["measured"]})
    return [f"{JOB_DIR}/slices/slice={k}/events.parquet" for k in ks]


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
    """What the pipeline produces for the job, before its catalog."""
    targets = [f"{JOB_DIR}/summary.txt"]
    if JOB.emulate.wanted:
        targets.append(f"{JOB_DIR}/emulation/summary.txt")
    if JOB.baseline.wanted(JOB.nproc):
        targets.append(f"{JOB_DIR}/baseline/summary.txt")
    return targets

