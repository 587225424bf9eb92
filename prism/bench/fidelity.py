"""`prism bench fidelity`: prism's predicted iteration time against the truth, over a matrix of layouts.

    prism bench fidelity [--matrix local|device|all] [--configs NAME,...] [--repeats 5] [--devices P]
                         [--steps 8] [--passes 1|2] [--sandbox slice|rank] [--no-emulate] [--out DIR] [--work DIR]
    prism bench fidelity --rescore DIR [DIR ...] [--out DIR]     (saved runs, calibrated anew)
    prism bench fidelity --summarize FILE [FILE ...]             (tables and means of results JSON)

Per config (a `moe_gpt` layout at W ranks), runs interleaved: truth, prism, truth, truth, ... (the truth
`--repeats` times, prism `--prism-runs` times, prism after the 1st, 2nd, ... truth run):

- truth: ``prism launch --nproc W --mode real --pin`` (every rank on its own core); the iteration time of a
  run is the median over iterations k >= 1 of the gap between the job's (k-1)-th and k-th iteration end,
  the job's iteration k ending when its last rank's ``iteration_end`` marker ends (`prism/iterations.py`,
  the definition `prism calibrate` and the summary use);
- prism: ``prism launch --mode capture --devices P``, ``prism graph``, ``prism.slices.plan --devices P``;
  every measured slice, one after the other, by ``prism.slices.run --all`` (untimed: replayed ranks answer at
  once), durations and transfers from them (`prism.calibrate.from_slices`), ``prism.calibrate`` -> ``JOB/calibrated``: one pass, what the
  pipeline does. With ``--passes 2`` calibration is iterated once: that first pass goes to
  ``JOB/calibrated_untimed`` and every slice runs again timed by it (``--timed-by``: replayed ranks answer
  at their calibrated times) into ``JOB/slices_timed`` -> ``JOB/calibrated`` (the final prediction; the
  first pass's is recorded beside it). The predicted iteration time comes from the calibrated timeline by
  the truth's definition;
- emulated sandbox: ``prism emulate --job JOB`` on the calibrated job; its measured iteration time and
  per-event durations (`prism/bench/fidelity_sandbox.py`). The sandbox is the stage's default rank (a rank
  of the last pipeline stage) and, with ``--sandbox slice`` (the default), the other ranks of its slice in
  the plan, so that the P device slots are busy as in a slice run (on CPU the compute of a lone sandbox
  rank is uncontended: 16-17 % shorter than the truth's, docs/fidelity.md); ``--sandbox rank``: the one
  rank. The metrics are the default rank's;
- ablation ("bare"): the same capture graph calibrated with its bare-graph durations (no slice runs).

Printed per config (`prism/bench/fidelity_table.py`): W, P, layout, the true iteration time (median over
runs of the per-run medians), the truth's spread (min-max of the per-run medians), the prediction (median
over prism runs), its error, whether it is inside the spread, per-event start and duration errors of the
first prism run's calibrated timeline against the first truth run (`event_errors`: events matched by
(rank, seq), only events of iterations >= 1; a start measured from the job's end of the previous iteration
in each clock; absolute errors, median and p95), the bare-graph prediction's error, and the prism runs'
count and min-max. Then the mean and max |error| over the matrix. `--out DIR` also writes DIR/fidelity.md
(the table) and DIR/fidelity.json (the raw results, every run; `--summarize` recomputes the table from it).

Everything runs as subprocesses of this Python (``python -m prism.cli``), so it works from a source tree
with ``PYTHONPATH=.``. A config that fails prints its row as FAILED with the reason and the matrix goes on.

What is not measured is kept short (docs/benchmarks.md, "the fidelity bench's fixed cost per config"): every
launch forks its zygote from one warm template that the bench starts (`prism.runtime.launch.zygote_template`;
``--new-zygotes``: a new interpreter a launch, as before), and the truth runs' graphs (``prism graph``, one a
run: every truth's is kept) are built after the config's last run, in parallel on this process's cores, then
the prism runs are scored. Nothing runs beside a measured run, on its cores or others.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prism.bench.fidelity_table import Config, Result, ResultsError, read_json, summarize, table, totals, write_json
from prism.bench.fidelity_table import MODEL, SMALL_MODEL  # noqa: F401  (the bench's names)
from prism.bench.fidelity_table import row, scored_by, source_digest  # noqa: F401  (scored_by: the bench's name)
from prism.bench import core_load, fidelity_sandbox
from prism.bench.fidelity_sandbox import emulated_sandbox  # noqa: F401  (the bench's name)
from prism.bench.fidelity_schedule import prism_schedule, variant_label, variant_options  # noqa: F401
from prism.bench.fidelity_steps import WORKLOAD, _prism, _py, _run, _run_parallel  # noqa: F401
from prism import job as job_files
from prism import settings
from prism.runtime.launch import launcher, zygote_template
from prism.iterations import job_iteration_ends



def _c(name: str, world: int, devices: int, *layout: str) -> Config:
    return Config(name, world, tuple(layout), devices)


# W=2 on this 2-core box (P=1), then W=8 (P=4) and W=16 (P=8) on the 16-core host.
LOCAL = [
    _c("dp2", 2, 1, "--dp", "2"),
    _c("tp2", 2, 1, "--tp", "2"),
    _c("pp2-mb4", 2, 1, "--pp", "2", "--microbatches", "4"),
]
DEVICE = [  # in the order they run: the most varied first (a --budget may cut the tail)
    _c("tp2pp2dp2-mb4", 8, 4, "--tp", "2", "--pp", "2", "--dp", "2", "--microbatches", "4"),
    _c("dp8-ep4", 8, 4, "--dp", "8", "--ep", "4"),
    _c("tp2dp4-ep4-var", 8, 4, "--tp", "2", "--dp", "4", "--ep", "4", "--var-seq"),
    _c("pp4dp2-mb8", 8, 4, "--pp", "4", "--dp", "2", "--microbatches", "8"),
    _c("tp2pp2dp4-ep2-mb4", 16, 8, "--tp", "2", "--pp", "2", "--dp", "4", "--ep", "2", "--microbatches", "4"),
    _c("tp4dp2", 8, 4, "--tp", "4", "--dp", "2"),
    _c("dp8-var", 8, 4, "--dp", "8", "--var-seq"),
    _c("pp2dp4-mb8", 8, 4, "--pp", "2", "--dp", "4", "--microbatches", "8"),
    _c("tp2pp2dp2-ep2-mb4", 8, 4, "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--microbatches", "4"),
    _c("tp2pp4-mb4", 8, 4, "--tp", "2", "--pp", "4", "--microbatches", "4"),
    _c("dp16-ep4", 16, 8, "--dp", "16", "--ep", "4"),
    _c("dp8", 8, 4, "--dp", "8"),
    _c("tp2dp4", 8, 4, "--tp", "2", "--dp", "4"),
    _c("tp2pp2dp2-mb4-var", 8, 4, "--tp", "2", "--pp", "2", "--dp", "2", "--microbatches", "4", "--var-seq"),
    _c("pp2dp4-ep4-mb2", 8, 4, "--pp", "2", "--dp", "4", "--ep", "4", "--microbatches", "2"),
    _c("tp2pp4dp2-mb4-var", 16, 8, "--tp", "2", "--pp", "4", "--dp", "2", "--microbatches", "4", "--var-seq"),
]
MATRICES = {"local": LOCAL, "device": DEVICE, "all": LOCAL + DEVICE}
BY_NAME = {c.name: c for c in LOCAL + DEVICE}


# ------------------------------------------------------------------------------------------ running


def run_truth(cfg: Config, args: list[str], out: Path, log: Path, timeout: float) -> None:
    _run(_prism("launch", "--nproc", str(cfg.world), "--mode", "real", "--pin", "--out", str(out),
                *WORKLOAD, *args), log, timeout)


def build_truth_graphs(runs: list[Path], log: Path, timeout: float) -> None:
    """`prism graph` of each truth run, in parallel on this process's cores (once no run is measured), then each
    run's raw streams removed but the first's (the score reads its iteration ends; a graph keeps the rest)."""
    _run_parallel([_prism("graph", "--job", str(run)) for run in runs], log, timeout,
                  jobs=min(len(runs), usable_cores()))
    for run in runs[1:]:
        shutil.rmtree(job_files.raw_dir(run), ignore_errors=True)


UNTIMED = job_files.UNTIMED_CALIBRATION  # the first pass's calibration (untimed slices), which times the second pass
TIMED = job_files.TIMED_SLICES  # the second pass's slice runs (prism.slices.run --timed-by) and their durations


def run_prism(cfg: Config, args: list[str], p: int, job: Path, log: Path, timeout: float,
              emulate: bool = True, passes: int = 1, sandbox: str = "slice", slice_load: str = "none",
              keep_whole: str = "", plan_rule: str = "") -> dict:
    """Capture, graph, plan; slices (untimed), from_slices, calibrate -> JOB/calibrated (with `passes` 2:
    -> JOB/calibrated_untimed, then slices timed by it -> JOB/slices_timed, calibrate -> JOB/calibrated);
    `prism emulate` on that (the sandbox: `fidelity_sandbox.sandbox_ranks`). `slice_load` "full" or
    "mirror": the slice runs under `core_load.CoreLoad` on the job's other cores (the affinity's cores P..W-1:
    those a slice's ranks leave to the replay server), at SCHED_IDLE; "mirror": core P+i copies the duty cycle
    of the slice rank's core i % P. `keep_whole`: the plan's `--keep-whole` (groups of those
    descriptions each in one slice). Returns the stage wall times (s)."""
    times = {}
    t = time.perf_counter()
    _run(_prism("launch", "--nproc", str(cfg.world), "--mode", "capture", "--devices", str(p),
                "--out", str(job_files.capture_dir(job)), *WORKLOAD, *args), log, timeout)
    times["capture"] = time.perf_counter() - t
    t = time.perf_counter()
    _run(_prism("graph", "--job", str(job), "--raw", str(job_files.raw_dir(job_files.capture_dir(job))),
                "--out", str(job_files.graph_dir(job))), log, timeout)
    _run(_py("prism.slices.plan", "--job", str(job), "--devices", str(p),
             *(("--keep-whole", keep_whole) if keep_whole else ()),
             *(("--rule", plan_rule) if plan_rule else ())), log, timeout)
    times["graph+plan"] = time.perf_counter() - t
    plan = pq.read_table(job_files.slice_plan(job))
    slices = sorted(set(plan.filter(plan.column("measured")).column("slice").to_pylist()))
    timeline = job_files.calibrated(job, folder=UNTIMED)
    for name, timed in (("slices", None), ("slices-timed", timeline))[:passes]:
        t = time.perf_counter()
        mine = sorted(os.sched_getaffinity(0))
        load_cores = mine[p:cfg.world] if slice_load != "none" else []
        mirror = [mine[i % p] for i in range(len(load_cores))] if slice_load == "mirror" else None
        with core_load.CoreLoad(load_cores, mirror=mirror) if load_cores else contextlib.nullcontext():
            if slices:  # every measured slice of the plan, one after the other, from one process
                _run(_py("prism.slices.run", "--job", str(job), "--all",
                         *(("--timed-by", str(timed)) if timed else ())), log, timeout * len(slices))
        folder = TIMED if timed else job_files.SLICES
        out = job_files.CALIBRATED if timed or passes == 1 else UNTIMED
        _run(_py("prism.calibrate.from_slices", "--job", str(job), "--slices", folder), log, timeout)
        _run(_py("prism.calibrate", "--job", str(job), "--durations", str(job_files.own_durations(job, folder)),
                 "--transfers", str(job_files.slice_transfers(job, folder)),
                 "--out", str(job_files.calibrated_dir(job, out))), log, timeout)
        times[name] = time.perf_counter() - t
    if emulate:
        t = time.perf_counter()
        ranks = fidelity_sandbox.sandbox_ranks(job, whole_slice=sandbox == "slice")
        try:
            _run(_prism("emulate", "--job", str(job), "--sandbox", ",".join(map(str, ranks)),
                        "--devices", str(len(ranks))), log, timeout)
        except StepError as exc:  # the prediction stands without it; the record says why it is missing
            (job / "emulate.failed").write_text(str(exc))
        times["emulate"] = time.perf_counter() - t
    return times


from prism.bench.fidelity_score import (  # noqa: E402,F401  (re-exported: the bench's names)
    StepError, _median_gap_ms, _strings, truth_ends, truth_rank_ends, calibrated, durations_from_slices, event_errors,
)


# ------------------------------------------------------------------------------------------ a config


def run_config(cfg: Config, p: int, repeats: int, prism_runs: int, steps: int, model: list[str], work: Path,
               timeout: float, emulate: bool = True, passes: int = 1, sandbox: str = "slice",
               variant: str = "none", alternate: bool = False) -> Result:
    res = Result(cfg, p, scored=scored_by())
    args = cfg.args(steps, model)
    base = work / cfg.name
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    log = base / "log.txt"
    truth0 = base / "truth0"
    try:
        labels: dict[int, str] = {}  # prism run -> its variant
        truths = 0
        for what, i, label in prism_schedule(repeats, prism_runs, variant, alternate):
            if what == "truth":
                t = time.perf_counter()
                run_truth(cfg, args, base / f"truth{i}", log, timeout)
                truths += 1
                res.stage_s[f"truth{i}"] = round(time.perf_counter() - t, 1)
                res.truth_ms.append(_median_gap_ms(*truth_ends(base / f"truth{i}")))
                res.truth_rank_ms.append(fidelity_sandbox.rank_iteration_ms(
                    *truth_rank_ends(base / f"truth{i}"), cfg.world))
            else:
                job = base / f"prism{i}"
                res.stage_s.update({f"prism{i}-{k}": round(v, 1)
                                    for k, v in run_prism(cfg, args, p, job, log, timeout, emulate, passes,
                                                          sandbox, *variant_options(label)).items()})
                labels[i] = label
                shutil.rmtree(job_files.payloads_dir(job_files.capture_dir(job)), ignore_errors=True)
        # after the last measured run: every truth's graph (each a second real run to compare with:
        # fidelity_terms --against), then the scores, which read truth0's
        t = time.perf_counter()
        build_truth_graphs([base / f"truth{i}" for i in range(truths)], log, timeout)
        res.stage_s["truth-graphs"] = round(time.perf_counter() - t, 1)
        for i in sorted(labels):
            t = time.perf_counter()
            score_prism_run(res, base / f"prism{i}", truth0 if i == 0 else None)
            if variant != "none":
                res.variant.append(labels[i])
            res.stage_s[f"prism{i}-calibrate"] = round(time.perf_counter() - t, 1)
    except Exception as exc:  # noqa: BLE001 -- one config's failure is reported in its row
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def score_prism_run(res: Result, job: Path, truth0: Path | None) -> None:
    """Append one prism run's prediction (the final calibration: timed slices where the run has them, else
    its slices), its first pass (untimed slices, when there is a timed pass), its ablation (bare graph) and
    its emulated sandbox (when it ran) to `res`; with `truth0`, also the per-event errors against that
    truth run."""
    timed = bool(job_files.slice_files(job, folder=TIMED))
    timeline, ends = calibrated(job, slices=True, folder=TIMED if timed else job_files.SLICES)
    res.pred_ms.append(_median_gap_ms(*ends))
    if timed:
        res.pred_untimed_ms.append(_median_gap_ms(*calibrated(job, slices=True, folder=job_files.SLICES)[1]))
    res.bare_ms.append(_median_gap_ms(*calibrated(job, slices=False)[1]))
    if truth0 is not None:
        res.events = event_errors(truth0, job, timeline,
                                  job_iteration_ends(*truth_ends_from_graph(truth0)), job_iteration_ends(*ends))
    if job_files.emulation(job).is_dir() or (job / "emulate.failed").is_file():
        res.emulated.append(emulated_sandbox(job, timeline, truth0))


def rescore(folders: list[Path]) -> list[Result]:
    """Results re-computed from saved runs (`--out DIR --work DIR`): the truth's iteration times from
    DIR/fidelity.json, every prism run's prediction and ablation anew from DIR/<config>/prism<i>, the
    per-event errors from prism0 against truth0 -- the calibration of runs made earlier or elsewhere, with
    this prism. A config whose saved prism runs are not all there is reported as failed (a rescore never
    mixes new predictions with old ones)."""
    results = []
    for folder in folders:
        try:
            saved = read_json(folder / "fidelity.json", BY_NAME)
        except ResultsError as exc:
            raise StepError(f"{exc} (a rescore reads the --out DIR of a bench run with --work DIR)") from None
        for old in saved:
            res = Result(old.cfg, old.p, truth_ms=old.truth_ms, stage_s=old.stage_s, error=old.error,
                         scored=scored_by())
            results.append(res)
            if res.error is not None:
                continue
            base = folder / old.cfg.name
            runs = max(len(old.pred_ms), 1)
            missing = [f"prism{i}" for i in range(runs) if not job_files.graph_dir(base / f"prism{i}").is_dir()]
            if missing:
                res.error = (f"rescore: {base}: saved run(s) {', '.join(missing)} missing ({runs} prism run(s) "
                             "in fidelity.json); rescore a folder that kept every run")
                continue
            try:
                for i in range(runs):
                    score_prism_run(res, base / f"prism{i}", base / "truth0" if i == 0 else None)
            except Exception as exc:  # noqa: BLE001 -- reported in the config's row
                res.error = f"rescore: {type(exc).__name__}: {exc}"
                res.pred_ms, res.bare_ms, res.events = [], [], None
    return results


def truth_ends_from_graph(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(iteration, end_ns) of the ``iteration_end`` markers of a real run, from its raw streams or, where
    they are gone (saved runs keep the graph only), its graph."""
    if job_files.rank_streams(run_dir):
        return truth_ends(run_dir)
    t = pq.read_table(job_files.graph_file(run_dir), columns=["kind", "op", "iteration", "t_end_ns"])
    sel = (_strings(t.column("kind")) == "marker") & (_strings(t.column("op")) == "iteration_end")
    return t.column("iteration").to_numpy()[sel], t.column("t_end_ns").to_numpy()[sel]


def usable_cores() -> int:
    """The cores this process may run on (its affinity: right under `taskset`), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def start_template() -> zygote_template.Template | None:
    """The warm zygote template the bench's launches fork their zygotes from; None (after saying why) when it
    does not start: the launches then start new zygotes, as with --new-zygotes."""
    try:
        return zygote_template.Template.start(launcher.template_environment())
    except (OSError, RuntimeError) as exc:
        print(f"prism bench fidelity: the zygote template did not start ({exc}); every launch starts a new zygote",
              file=sys.stderr, flush=True)
        return None


def _write(out: Path, md_lines: list[str], results: list[Result]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "fidelity.json", results)
    tmp = out / ".fidelity.md.tmp"
    tmp.write_text("\n".join(md_lines) + "\n")
    tmp.replace(out / "fidelity.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench fidelity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", choices=sorted(MATRICES), default="local",
                        help="local: W=2 (2 cores); device: W=8 and W=16 (16 cores); all")
    parser.add_argument("--configs", help=f"comma-separated config names (any of {', '.join(BY_NAME)})")
    parser.add_argument("--repeats", type=int, default=5, help="truth runs per config")
    parser.add_argument("--prism-runs", type=int, default=1, help="prism predictions per config")
    parser.add_argument("--devices", type=int, help="device slots P (default: per config, W/2)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="the small default model (smoke test)")
    parser.add_argument("--no-emulate", action="store_true", help="skip the emulated sandbox (prism emulate)")
    parser.add_argument("--passes", type=int, choices=(1, 2), default=1,
                        help="1: calibrate from untimed slice runs (the pipeline's way); 2: then re-run the slices "
                             "timed by that calibration and calibrate again")
    parser.add_argument("--sandbox", choices=("slice", "rank"), default="slice",
                        help="the emulated sandbox: the default rank and the rest of its slice (P ranks), or the "
                             "default rank alone")
    parser.add_argument("--slice-load", choices=("none", "full", "mirror"), default="none",
                        help="full: run the slice runs while the job's other cores (those a slice leaves to its "
                             "replay server) run the workload at SCHED_IDLE; mirror: those cores compute only while "
                             "a slice rank's core does (prism/bench/core_load.py; an experiment)")
    parser.add_argument("--plan-keep", default="", metavar="DESC[,DESC...]",
                        help="the slice plan's --keep-whole: each group of these descriptions (e.g. tp) in one slice")
    parser.add_argument("--plan-rule", default="", choices=("", "sync-first", "bytes"),
                        help="the slice plan's --rule (default: the plan's own, sync-first)")
    parser.add_argument("--alternate", action="store_true",
                        help="with --slice-load and/or --plan-keep: between every two truth runs one prism run of "
                             "the defaults and one with them")
    parser.add_argument("--new-zygotes", action="store_true",
                        help="every launch starts a new zygote interpreter (default: its zygote is forked from one "
                             "warm template the bench starts, prism.runtime.launch.zygote_template)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per pipeline step")
    parser.add_argument("--out", type=Path, help="write fidelity.md and fidelity.json here (after every config)")
    parser.add_argument("--budget", type=float, help="seconds: start no config that the slowest so far would "
                        "carry past this (the rest are listed as skipped)")
    parser.add_argument("--work", type=Path, help="job folders (default: a temporary folder, removed)")
    parser.add_argument("--rescore", type=Path, nargs="+", metavar="DIR",
                        help="run nothing: re-compute the predictions of saved runs (folders given as both --out "
                             "and --work of earlier benches) with this prism, print their table and, with "
                             "--out, write it and the JSON it scored there")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables and means of results files (fidelity.json, e.g. "
                             "docs/results/fidelity/*.json)")
    parser.add_argument("--digest", action="store_true",
                        help="run nothing: print this tree's prism sources digest (the `scored.digest` of a run)")
    args = parser.parse_args(argv)
    if args.digest:
        print(source_digest())
        return 0
    if args.summarize:
        try:
            print(summarize(args.summarize, BY_NAME), end="")
        except ResultsError as exc:
            print(f"prism bench fidelity: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.rescore:
        try:
            results = rescore(args.rescore)
        except StepError as exc:
            print(f"prism bench fidelity: {exc}", file=sys.stderr)
            return 2
        lines = [f"prism bench fidelity --rescore {' '.join(map(str, args.rescore))}", ""] + table(results)
        print("\n".join(lines))
        if args.out:
            _write(args.out, lines, results)
        return 0 if results and all(not r.error for r in results) else 1
    variant = variant_label(args.slice_load, args.plan_keep, args.plan_rule)
    if args.alternate and variant == "none":
        print("prism bench fidelity: --alternate alternates prism runs of the defaults with a variant: name it with "
              "--slice-load full|mirror, --plan-keep DESC and/or --plan-rule RULE", file=sys.stderr)
        return 2
    if args.configs:
        unknown = [n for n in args.configs.split(",") if n not in BY_NAME]
        if unknown:
            print(f"prism bench fidelity: unknown configs {unknown}; known: {', '.join(BY_NAME)}", file=sys.stderr)
            return 2
        configs = [BY_NAME[n] for n in args.configs.split(",")]
    else:
        configs = MATRICES[args.matrix]
    cores = usable_cores()
    too_big = [c.name for c in configs if c.world > cores]
    if too_big:
        print(f"prism bench fidelity: {too_big} need more ranks than the {cores} cores this process may use "
              "(the truth pins one rank per core; see `taskset -p $$`)", file=sys.stderr)
        return 2
    model = SMALL_MODEL if args.small else MODEL
    work = args.work or Path(tempfile.mkdtemp(prefix="prism-fidelity-"))
    started = datetime.datetime.now(datetime.timezone.utc)
    t_all = time.perf_counter()  # (the --budget's clock: from here, the template's start included)
    template = None if args.new_zygotes else start_template()
    t_template = time.perf_counter() - t_all
    if template is not None:  # every launch below (truth, capture, slices, emulate) forks its zygote from it
        os.environ[settings.ZYGOTE_TEMPLATE.name] = template.path
    import torch

    prism_runs = (f"{2 * (args.repeats - 1)} alternating none/{variant}" if args.alternate
                  else f"{args.prism_runs}" + (f" as {variant}" if variant != "none" else ""))
    intro = [f"prism bench fidelity: {started:%Y-%m-%d %H:%M} UTC, {cores} cores, torch {torch.__version__}, "
             f"python {sys.version.split()[0]}; truth x{args.repeats}, prism x{prism_runs} ({args.passes} pass(es), "
             f"sandbox: {args.sandbox}), "
             f"{args.steps} steps; model {' '.join(model)}; zygotes: "
             f"{f'forked from a warm template (started in {t_template:.1f} s)' if template else 'new ones'}", ""] \
        + table([])[:2]
    print("\n".join(intro), flush=True)
    results = []
    skipped: list[str] = []

    def write(final: bool) -> None:
        tail = [""] + totals(results) + [f"wall: {time.perf_counter() - t_all:.0f} s"]
        if skipped:
            tail.append(f"skipped (--budget {args.budget:.0f} s): {', '.join(skipped)}")
        if final:
            print("\n".join(tail), flush=True)
        if args.out:
            _write(args.out, intro + [row(r) for r in results] + tail, results)

    slowest = 0.0
    try:
        for cfg in configs:
            elapsed = time.perf_counter() - t_all
            if args.budget and elapsed + slowest * (cfg.world / 8 if cfg.world > 8 else 1) > args.budget:
                skipped.append(cfg.name)
                continue
            p = args.devices or cfg.devices
            t = time.perf_counter()
            r = run_config(cfg, min(p, cfg.world - 1) if cfg.world > 1 else 1, args.repeats, args.prism_runs,
                           args.steps, model, work, args.timeout, not args.no_emulate, args.passes, args.sandbox,
                           variant, args.alternate)
            slowest = max(slowest, (time.perf_counter() - t) * (8 / cfg.world if cfg.world > 8 else 1))
            results.append(r)
            print(row(r), flush=True)
            write(False)
    finally:
        write(True)
        if template is not None:
            os.environ.pop(settings.ZYGOTE_TEMPLATE.name, None)
            template.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if results and all(not r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
