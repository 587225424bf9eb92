"""The report stage: ``python -m prism.report --job DIR [--out FILE]`` (``prism report``).

Writes ``DIR/report/report.html`` (atomically: a temp name, then a rename), one self-contained page:
predicted iteration time per rank and overall, the critical path, compute/communication/idle per rank,
peak memory per rank, a timeline of one iteration, and, when they exist, the emulation's sandbox ranks
and the baseline against the prediction. Needs the calibrated timeline (``DIR/calibrated/``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prism import folder_lock
from prism import job as job_files
from prism.artifacts import check_out, same_run, stage_error


def write_report(job: Path, out: Path | None = None, ranks: list[int] | None = None) -> Path:
    from prism.report.html import build

    out = check_out(out or job_files.report(job))
    # one run's artifacts (an emulation/ or calibrated/ copied from another run is named, not shown)
    inputs = [p for p in (job_files.meta_path(job), job_files.meta_path(job_files.capture_dir(job)),
                          job_files.graph_file(job), job_files.calibrated(job),
                          job_files.emulation(job, "events.parquet")) if p.is_file()]
    if len(inputs) > 1:
        same_run(inputs)
    page = build(job, ranks)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _ranks(text: str) -> list[int]:
    try:
        return sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give rank numbers separated by commas, e.g. 3,17") from None


@folder_lock.locks_job("prism report")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder (results/<job>) holding calibrated/")
    parser.add_argument("--out", type=Path, help="HTML file to write (default: JOB/report/report.html)")
    parser.add_argument("--ranks", type=_ranks, help="ranks the per-rank timeline draws, e.g. 3,17 (default: every "
                        "rank up to 32, else the critical path's ranks, rank 0 and the last)")
    args = parser.parse_args(argv)
    if not args.job.is_dir():
        print(f"prism report: error: {args.job} is not a job folder: run the pipeline first (make demo, or "
              "snakemake -s workflow/Snakefile --profile profiles/local)", file=sys.stderr)
        return 2
    try:
        out = write_report(args.job, args.out, args.ranks)
    except Exception as exc:
        return stage_error("prism report", args.job, args.out, exc)
    print(f"prism report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
