# Validates the config against schemas/config.schema.yaml and holds the helpers the rules share.
import json
import os

from snakemake.utils import validate

from prism import config as prism_config

validate(config, "../../schemas/config.schema.yaml")
JOB = prism_config.from_dict(dict(config), "config")
JOB_DIR = str(JOB.job_dir)


def section(name):
    """The settings a stage needs, as JSON: passed to the stage and kept as the rule's params, so changing
    them re-runs that rule and what follows it, and changing other sections does not."""
    keep = {"job": config["job"], "nproc": config["nproc"], "workload": config["workload"]}
    if name in config:
        keep[name] = config[name]
    return json.dumps(keep, sort_keys=True)


def measured_slices(wildcards):
    """The events of every measured slice: known once the slice_plan checkpoint has run."""
    import pyarrow.parquet as pq

    plan = checkpoints.slice_plan.get().output[0]
    rows = pq.read_table(plan, columns=["slice", "measured"]).to_pylist()
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
    targets = [f"{JOB_DIR}/summary.txt"]
    if JOB.emulate.wanted:
        targets.append(f"{JOB_DIR}/emulation/summary.txt")
    if JOB.baseline.wanted(JOB.nproc):
        targets.append(f"{JOB_DIR}/baseline/summary.txt")
    return targets
