"""Baseline stage: the real run of a job config, every rank on its own device (the ground truth).

    python -m prism.baseline --config JOB.yaml --out DIR     ->  DIR/raw/ (PrismTrace of the real run)

On CPU a device is a core: ranks are pinned (rank i on core i mod cores, one intra-op thread). When W
exceeds the cores the run is still real but oversubscribed; `meta.json` records the cores so the summary
can say the timings are not ground truth.
"""

from __future__ import annotations

import sys

from prism import job_stage
from prism.runtime.launch import launcher


def main(argv: list[str] | None = None) -> int:
    return job_stage.main("baseline", __doc__, argv, lambda job, out, force: launcher.LaunchSpec(
        nproc=job.nproc, script=job.workload.script, module=job.workload.module, args=job.workload.args,
        mode="real", out=out, pin=job.baseline.pin, force=force))


if __name__ == "__main__":
    sys.exit(main())
