"""Capture stage: the W ranks of a job run on P device slots through the coordinator (DESIGN §3).

    python -m prism.capture --config-json JSON --out DIR     ->  DIR/raw/ (PrismTrace), DIR/payloads/

The graph stage then turns DIR/raw into the bare graph. Runs `prism launch --mode capture`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prism import config as prism_config
from prism.runtime import launcher


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    prism_config.add_job_arguments(parser)
    parser.add_argument("--out", type=Path, help="output folder (default: <results>/<job>/capture)")
    parser.add_argument("--force", action="store_true",
                        help="clear the output folder first if it holds files (a re-run; by default refused)")
    args = parser.parse_args(argv)
    try:
        job = prism_config.from_arguments(args)
    except prism_config.ConfigError as exc:
        print(f"prism capture: error: {exc}", file=sys.stderr)
        return 2
    os.environ.update(job.environment())  # the ranks run where the config says (PRISM_DEVICE)
    spec = launcher.LaunchSpec(nproc=job.nproc, script=job.workload.script, module=job.workload.module,
                               args=job.workload.args, mode="capture", out=args.out or job.job_dir / "capture",
                               devices=job.capture.devices, payloads=job.capture.payloads, force=args.force)
    try:
        return launcher.launch(spec)
    except launcher.LaunchError as exc:
        print(f"prism capture: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
