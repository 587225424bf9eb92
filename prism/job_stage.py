"""The command line the stages that launch a job's ranks share (`prism baseline`, `prism capture`): read the job
config, set the ranks' environment, launch the spec the stage builds, and turn a bad config or a refused launch
into one error line and exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from prism import config as prism_config
from prism.runtime.launch import launcher


def main(stage: str, doc: str | None, argv: list[str] | None,
         spec_of: Callable[[prism_config.JobConfig, Path, bool], launcher.LaunchSpec]) -> int:
    """`prism STAGE --config ... [--out DIR] [--force]`; spec_of(job, out, force) builds what to launch, out
    defaulting to <results>/<job>/STAGE."""
    parser = argparse.ArgumentParser(prog=f"prism {stage}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    prism_config.add_job_arguments(parser)
    parser.add_argument("--out", type=Path, help=f"output folder (default: <results>/<job>/{stage})")
    parser.add_argument("--force", action="store_true",
                        help="clear the output folder first if it holds files (a re-run; by default refused)")
    args = parser.parse_args(argv)
    try:
        job = prism_config.from_arguments(args)
    except prism_config.ConfigError as exc:
        print(f"prism {stage}: error: {exc}", file=sys.stderr)
        return 2
    os.environ.update(job.environment())  # the ranks run where the config says (PRISM_DEVICE)
    try:
        return launcher.launch(spec_of(job, args.out or job.job_dir / stage, args.force))
    except launcher.LaunchError as exc:
        print(f"prism {stage}: error: {exc}", file=sys.stderr)
        return 2
