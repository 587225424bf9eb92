# Validates the config against schemas/config.schema.yaml and holds the helpers the rules share.
import json
import os

from snakemake.utils import validate

from prism import config as prism_config

validate(config, "../../schemas/config.schema.yaml")
JOB = prism_config.from_dict(dict(config), "config")
JOB_DIR = str(JOB.job_dir)
# The config file the stages read (the one given with --configfile, else the embedded default).
CONFIG_FILE = workflow.overwrite_configfiles[-1] if workflow.overwrite_configfiles else "prism/configs/default.yaml"


def section(name):
    """A config section as JSON: a rule's params, so changing it re-runs that rule (and only what follows)."""
    return json.dumps({"nproc": JOB.nproc, "workload": config["workload"], name: config.get(name, {})},
                      sort_keys=True)


def final_targets():
    targets = []
    if JOB.baseline.wanted(JOB.nproc):
        targets.append(f"{JOB_DIR}/baseline/summary.txt")
    return targets
