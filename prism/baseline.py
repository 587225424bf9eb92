"""Baseline stage: the real run of a job config, every rank on its own device (the ground truth).

    prism baseline --config JOB.yaml --out DIR     ->  DIR/raw/ (PrismTrace of the real run)
    prism baseline --config JOB.yaml --decide FILE ->  FILE: whether the baseline runs here, and why

On CPU a device is a core: ranks are pinned (rank i on core i mod cores, one intra-op thread). When W
exceeds the cores the run is still real but oversubscribed; `meta.json` records the cores so the summary
can say the timings are not ground truth. `baseline.run: auto` runs it only where W fits (one core per rank):
`--decide` says so on the machine that would run it (the pipeline's baseline_decision rule, on the node the
baseline would get), and the report quotes its reason when the baseline was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from prism import config as prism_config
from prism import job_stage
from prism.runtime.launch import launcher


def decision(job: prism_config.JobConfig, cores: int | None = None) -> dict:
    """Whether the baseline of `job` runs on this machine (`cores`: the cores this process may use), and why."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    run = job.baseline.wanted(job.nproc, cores)
    setting = job.baseline.run
    if setting == "always":
        reason = f"baseline.run: always (W={job.nproc} on {cores} cores)"
    elif setting == "never":
        reason = "baseline.run: never"
    elif run:
        reason = f"baseline.run: auto, and W={job.nproc} ranks fit the {cores} cores here (one core per rank)"
    else:
        reason = (f"baseline.run: auto, and W={job.nproc} ranks do not fit the {cores} cores of {socket.gethostname()} "
                  "(one core per rank: an oversubscribed run would not be ground truth); set baseline.run: always "
                  "to run it anyway")
    return {"run": run, "setting": setting, "nproc": job.nproc, "cores": cores, "host": socket.gethostname(),
            "reason": reason}


def _decide(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prism baseline --decide", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    prism_config.add_job_arguments(parser)
    parser.add_argument("--decide", type=Path, required=True, help="where to write the decision (JSON)")
    args = parser.parse_args(argv)
    try:
        job = prism_config.from_arguments(args)
    except prism_config.ConfigError as exc:
        print(f"prism baseline: error: {exc}", file=sys.stderr)
        return 2
    made = decision(job)
    args.decide.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.decide.with_name(args.decide.name + ".tmp")
    tmp.write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, args.decide)
    print(f"prism baseline: {'runs' if made['run'] else 'skipped'}: {made['reason']}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--decide" or a.startswith("--decide=") for a in argv):
        return _decide(argv)
    return job_stage.main("baseline", __doc__, argv, lambda job, out, force: launcher.LaunchSpec(
        nproc=job.nproc, script=job.workload.script, module=job.workload.module, args=job.workload.args,
        mode="real", out=out, pin=job.baseline.pin, force=force))


if __name__ == "__main__":
    sys.exit(main())
