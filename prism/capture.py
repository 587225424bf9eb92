"""Capture stage: the W ranks of a job run on P device slots through the coordinator (DESIGN §3).

    python -m prism.capture --config-json JSON --out DIR     ->  DIR/raw/ (PrismTrace), DIR/payloads/

The graph stage then turns DIR/raw into the bare graph. Runs `prism launch --mode capture`.
"""

from __future__ import annotations

import sys

from prism import job_stage
from prism.runtime.launch import launcher


def main(argv: list[str] | None = None) -> int:
    return job_stage.main("capture", __doc__, argv, lambda job, out, force: launcher.LaunchSpec(
        nproc=job.nproc, script=job.workload.script, module=job.workload.module, args=job.workload.args,
        mode="capture", out=out, devices=job.capture.devices, payloads=job.capture.payloads, force=force))


if __name__ == "__main__":
    sys.exit(main())
