"""Issue 22: the emulation export's backward flow arrows, before and after the tail sweep (`prism.emulate.tail`).

    .venv/bin/python scripts/emulation_flows.py JOB N [SANDBOX]

JOB: a job folder through calibration (the tiny job: `snakemake ... --configfile tests/data/tiny.yaml`, then
its `results/tiny`; this script replaces JOB/emulation). Runs the emulate stage N times (sandbox SANDBOX,
default "1", one device slot, as the pipeline's tiny config), keeps each launch's raw run folder, and rebuilds
that run's emulation events twice: with the computed rows only shifted onto their rank's live rows (the emulate
stage before the tail sweep) and with the tail sweep (now). Prints, per run, the arrows, those pointing
backwards (the export's ``flows_left_out``) with the pair of events, the smallest slack (a wait's end minus its
comm's last arrival) and whether the table is one clock per (rank, stream).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import types
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prism import artifacts, schemas  # noqa: E402
from prism import job as job_files  # noqa: E402
from prism.calibrate import substitute  # noqa: E402
from prism.emulate import outputs, stage, tail  # noqa: E402
from prism.job import load_graph  # noqa: E402
from prism.report import export  # noqa: E402


def run_emulations(job: Path, keep: Path, n: int, sandbox: str) -> list[Path]:
    runs = []
    for k in range(n):
        def launch(cmd, run_dir, k=k):
            code = stage._run(cmd, run_dir.parent / "launch.log")
            shutil.copytree(run_dir, keep / f"run{k}", dirs_exist_ok=True)
            return code
        stage._emulate(job, sandbox, 1, None, True, None, True, True, launch, ())
        runs.append(keep / f"run{k}")
    return runs


def main() -> int:
    job, n = Path(sys.argv[1]), int(sys.argv[2])
    sandbox = sys.argv[3] if len(sys.argv) > 3 else "1"
    ranks = [int(r) for r in sandbox.split(",")]
    graph_job = load_graph(job)
    durations, transfers, source = substitute.calibrated_inputs(job, graph_job)
    graph = artifacts.read_parquet(job_files.graph_file(job, "events")).sort_by(
        [("rank", "ascending"), ("seq", "ascending")])
    swept = tail.sweep_tails
    with tempfile.TemporaryDirectory() as keep:
        runs = run_emulations(job, Path(keep), n, sandbox)
        print("| run | rows after the live ones | arrows | backwards | smallest slack (us) | one clock |")
        print("|---|---|---|---|---|---|")
        for run in runs:
            for name, fn in (("shifted (before)", lambda g, live, d, x, s, e: (s, e)), ("tail sweep (now)", swept)):
                tail.sweep_tails = fn
                try:
                    em = outputs.build(graph_job, graph, run, ranks, durations, transfers, None,
                                       substitute.measured_by_slices(source))
                finally:
                    tail.sweep_tails = swept
                ev = pl.from_arrow(em.tables["events"])
                flows = export._flows(types.SimpleNamespace(events=ev))
                back = [f for f in flows if f[3] < f[1]]
                slack = min((dn - sn for _, sn, _, dn in flows), default=0) / 1e3
                clock = schemas.timeline_problem(em.tables["events"]) is None
                print(f"| {run.name} | {name} | {len(flows)} | {len(back)} | {slack:.1f} | {clock} |")
                for s, sn, d, dn in back:
                    src, dst = ev.row(s, named=True), ev.row(d, named=True)
                    print(f"|  | rank {src['rank']} seq {src['seq']} {src['op']} ({src['source']}) issued at "
                          f"{sn / 1e6:.3f} ms; rank {dst['rank']} seq {dst['seq']} {dst['kind']} ({dst['source']}) "
                          f"ended at {dn / 1e6:.3f} ms | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
