"""Baseline stage: the real run of a job config, every rank on its own device (the ground truth).

    python -m prism.baseline --config JOB.yaml --out DIR     ->  DIR/raw/ (PrismTrace of the real run)

On CPU a device is a core: ranks are pinned (rank i on core i mod cores, one intra-op thread). When W
exceeds the cores the run is still real but oversubscribed; `meta.json` records the cores so the summary
can say the timings are not ground truth.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prism import config as prism_config
from prism.runtime import launcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism baseline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    prism_config.add_job_arguments(parser)
    parser.add_argument("--out", type=Path, help="output folder (default: <results>/<job>/baseline)")
    parser.add_argument("--force", action="store_true",
                        help="clear the output folder first if it holds files (a re-run; by default refused)")
    args = parser.parse_args(argv)
    try:
        job = prism_config.from_arguments(args)
    except prism_config.ConfigError as exc:
        print(f"prism baseline: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or job.job_dir / "baseline"
    os.environ.update(job.environment())  # the ranks run where the config says (PRISM_DEVICE)
    spec = launcher.LaunchSpec(nproc=job.nproc, script=job.workload.script, module=job.workload.module,
                               args=job.workload.args, mode="real", out=out, pin=job.baseline.pin,
                               force=args.force)
    try:
        return launcher.launch(spec)
    except launcher.LaunchError as exc:
        print(f"prism baseline: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
