"""`prism bench overhead`: what recording costs. The reference workload (W=2, pinned) three ways —
no recording (no interception at all), PrismTrace (`--mode real --out`), and torch.profiler with a Kineto
JSON export — run interleaved (A B C, C B A, ...), every run's ranks pinned to the same cores (`--cores`; default
the affinity's last). Prints the median iteration time of each, the overhead ratios against no recording, and
the bytes each writes per iteration; then each round's run medians (a slow run shows), each variant's ratio to
the baseline run of its round, their median and spread, and a warning where the spread exceeds the overhead
(`overhead_stats`: on the H200 host a run's speed changed between runs by more than PrismTrace costs).

`--interleave` compares within one process instead (the host's speed level moved within runs on the H200): one
`--mode real` run whose ranks switch PrismTrace off and on between steps, by blocks of `--block` steps
(`interleave_rank`); each on block against the mean of the off blocks either side, the median of those ratios with
an order-statistic interval, the pairs the level changed in, the pooled medians (`overhead_stats.interleaved`).

`--device cuda` runs the workload on the GPU (`--device cuda`; NCCL with a GPU per rank, else gloo with
CUDA tensors) and records PrismTrace with the CUDA clock (`PRISM_DEVICE=cuda`: CUDA events at every event
boundary, read lazily, and the caching allocator's memory at every marker).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from prism import settings
from prism.bench import overhead_stats as stats
from prism.runtime.launch import launcher

DRIVER = Path(__file__).with_name("driver.py")
INTERLEAVE_RANK = Path(__file__).with_name("interleave_rank.py")
VARIANTS = ("none", "prismtrace", "profiler")


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def warmup_steps(steps: int) -> int:
    """The first iterations left out of the medians (the first step's lazy initialisations)."""
    return max(1, steps // 5)


def run_variant(variant: str, work: Path, nproc: int, workload: list[str], steps: int,
                wrap: list[str] = (), cores: list[int] = ()) -> tuple[list[float], int]:
    """One run; returns (per-iteration times in ms after warm-up, bytes written). `wrap`: a program (and its
    arguments) each rank runs instead of the driver, that runs the driver in turn (a profiler's). `cores`: the
    cores the ranks are pinned to, in rank order (default: the launcher's first free ones)."""
    times = work / "times"
    profile = work / "profile"
    out = work / "job"
    for d in (times, profile):
        d.mkdir(parents=True)
    prog = [*wrap, str(DRIVER), "--times", str(times)]
    if variant == "profiler":
        prog += ["--profile", str(profile)]
    prog += workload
    spec = launcher.LaunchSpec(nproc=nproc, script=prog[0], args=prog[1:], pin=True, pin_cores=list(cores),
                               mode="real" if variant == "prismtrace" else "off",
                               out=out if variant == "prismtrace" else None)
    code = _quiet_launch(spec)
    if code != 0:
        raise RuntimeError(f"benchmark run '{variant}' failed with exit code {code}")
    per_rank = [json.loads((times / f"rank{r}.json").read_text()) for r in range(nproc)]
    # the job's iteration k ends when its slowest rank's step ends
    ends = [max(stamps[k] for stamps in per_rank) for k in range(len(per_rank[0]))]
    warm = warmup_steps(steps)
    durations = [(b - a) / 1e6 for a, b in zip(ends[warm:], ends[warm + 1:])]
    written = _folder_bytes(out) if variant == "prismtrace" else (
        _folder_bytes(profile) if variant == "profiler" else 0)
    return durations, written


def _quiet_launch(spec) -> int:
    saved = os.dup(1)  # the workload's loss lines are not the benchmark's output
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        return launcher.launch(spec)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def interleave_warmup(block: int) -> int:
    """The first steps `--interleave` leaves out: the first step's lazy initialisations, and the first on and
    off blocks (a first marker, a first event on the device)."""
    return max(4, 2 * block)


def run_interleaved(work: Path, nproc: int, workload: list[str], block: int,
                    cores: list[int] = (), ablate: list[str] = ()) -> dict:
    """One `prism launch --mode real` run of the reference workload whose ranks switch PrismTrace off and on by
    blocks of `block` steps (`interleave_rank`). Returns the job's step times (ms: from the last rank's start of
    the step to the last rank's end of it), each step's state, the events rank 0 recorded in each step, the
    size of torch's global hook dicts at each step's start (rank 0), the bytes written and the ranks' cores."""
    times, out = work / "times", work / "job"
    times.mkdir(parents=True)
    if workload[:2] != ["-m", "prism.workloads.moe_gpt"]:
        raise ValueError("--interleave runs the reference workload (prism.workloads.moe_gpt) only")
    prog = [str(INTERLEAVE_RANK), "--times", str(times), "--block", str(block),
            *(["--ablate", ",".join(ablate)] if ablate else []), *workload[2:]]
    spec = launcher.LaunchSpec(nproc=nproc, script=prog[0], args=prog[1:], pin=True, pin_cores=list(cores),
                               mode="real", out=out)
    code = _quiet_launch(spec)
    if code != 0:
        raise RuntimeError(f"the interleaved run failed with exit code {code}")
    per_rank = [json.loads((times / f"rank{r}.json").read_text()) for r in range(nproc)]
    states = per_rank[0]["on"]
    if any(r["on"] != states for r in per_rank):
        raise RuntimeError("the ranks' on/off schedules differ: the steps cannot be paired")
    durations = [(max(r["end"][k] for r in per_rank) - max(r["start"][k] for r in per_rank)) / 1e6
                 for k in range(len(states))]
    return {"durations": durations, "on": states, "events": per_rank[0]["events"], "hooks": per_rank[0]["hooks"],
            "gc": per_rank[0].get("gc", []), "gc_us": per_rank[0].get("gc_us", []),
            "bytes": _folder_bytes(out), "cores": ranks_cores(work, nproc)}


def interleave_report(runs: list[dict], where: str, nproc: int, cores: list[int], workload: list[str], steps: int,
                      block: int, warm: int, level: float, goal: float | None, confidence: float = 0.95) -> str:
    """The table of `--interleave`: the steps of each state (their median and spread, the events recorded and the
    global hooks installed in them), the pairs (an on block against the mean of the off blocks either side): their
    median ratio with its order-statistic interval, how many pairs the host's level changed in, the pooled medians;
    warnings where the interval cannot show the overhead; the goal's verdict when one is given."""
    parts = [stats.interleaved(r["durations"], r["on"], warm, level) for r in runs]
    result = stats.Interleaved([x for p in parts for x in p.ratios], [x for p in parts for x in p.changed],
                               [x for p in parts for x in p.on_steps], [x for p in parts for x in p.off_steps], level)
    lines = [f"\nprism bench overhead --interleave: {where}, W={nproc} pinned to core(s) {','.join(map(str, cores))}, "
             f"workload `{' '.join(workload[2:])}`, {len(runs)} process(es) of {steps} steps, PrismTrace (real mode) "
             f"switched off and on in one process every {block} step(s), off first; the first {warm} steps left out"]
    lines.append(f"{'state':<6} {'steps':>6} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'events/step':>12} "
                 f"{'global hooks':>13}")
    for name, flag, steps_ in (("off", False, result.off_steps), ("on", True, result.on_steps)):
        d = sorted(steps_)
        ev = [e for r in runs for e, o in zip(r["events"][warm:], r["on"][warm:]) if o == flag]
        hk = sorted({h for r in runs for h, o in zip(r["hooks"][warm:], r["on"][warm:]) if o == flag})
        if not d:
            lines.append(f"{name:<6} {0:>6}")
            continue
        lines.append(f"{name:<6} {len(d):>6} {statistics.median(d):10.3f} {d[len(d) // 10]:8.3f} "
                     f"{d[9 * len(d) // 10]:8.3f} {statistics.median(ev):12.0f} {','.join(map(str, hk)):>13}")
    if result.ratios:
        lo, hi, cover = result.ci(confidence)
        interval = (f"{100 * lo:+.2f} .. {100 * hi:+.2f} % ({100 * cover:.1f} % order-statistic interval)"
                    if lo != float("-inf") else "no interval (too few pairs)")
        steady = result.steady_overhead
        lines.append(f"pairs (an on block / the mean of the off blocks either side): {len(result.ratios)}; "
                     f"median {100 * result.overhead:+.2f} %, {interval}; min .. max "
                     f"{100 * (min(result.ratios) - 1):+.2f} .. {100 * (max(result.ratios) - 1):+.2f} %")
        lines.append(f"level changed (the two off blocks > {100 * level:g} % apart) in {sum(result.changed)} of "
                     f"{len(result.ratios)} pairs; the other pairs' median "
                     + (f"{100 * steady:+.2f} %" if steady is not None else "-"))
        lines.append(f"pooled medians: on {statistics.median(result.on_steps):.3f} ms / off "
                     f"{statistics.median(result.off_steps):.3f} ms = {100 * result.pooled:+.2f} %; "
                     f"each process's pairs' median: "
                     + ", ".join(f"{100 * p.overhead:+.2f} %" if p.ratios else "-" for p in parts))
    on_steps = sum(sum(1 for o in r["on"] if o is not False) for r in runs) / len(runs)
    ablated = any(isinstance(o, str) for r in runs for o in r["on"])
    lines.append(f"written: {statistics.median(r['bytes'] for r in runs) / max(1, on_steps):,.0f} "
                 "B per on step (the recorder's raw stream" + ("; over the ablated on steps too" if ablated else "")
                 + "); not switched: prism's process groups (an op still passes their `_issue`) and real mode's "
                 "watchdog thread")
    if all(r.get("gc") for r in runs):
        lines.append(gc_line(runs, warm))
    recorded = sorted({tuple(c) for r in runs for c in r["cores"]})
    expected = sorted(tuple([c]) for c in cores)
    lines.append(f"cores the ranks recorded (affinity): {recorded}"
                 + ("" if recorded == expected else f" - not the pinned {cores}"))
    lines += [f"warning: {w}" for w in stats.interleave_warnings(result, confidence)]
    if goal is not None:
        lines.append(stats.goal_verdict(result, goal, confidence))
    names = [n for n in dict.fromkeys(o for r in runs for o in r["on"]) if isinstance(n, str)]
    if names:
        lines.append(ablation_table(runs, names, warm, level, confidence))
    return "\n".join(lines)


def gc_line(runs: list[dict], warm: int) -> str:
    """The garbage collections inside the steps of each state (rank 0): how many a step and their time, mean and
    largest (a full collection of the heap shows as one large time)."""
    parts = []
    names = [n for n in dict.fromkeys(o for r in runs for o in r["on"]) if isinstance(n, str)]
    for name, flag in (("off", False), ("on", True), *((f"-{n}", n) for n in names)):
        n = [c for r in runs for c, o in zip(r["gc"][warm:], r["on"][warm:]) if o == flag]
        us = [t for r in runs for t, o in zip(r["gc_us"][warm:], r["on"][warm:]) if o == flag]
        if n:
            parts.append(f"{name} {sum(n) / len(n):.3f} a step, {sum(us) / len(us):.0f} us a step (mean), "
                         f"largest {max(us):.0f} us")
    return "garbage collections inside the steps (rank 0): " + "; ".join(parts)


def ablation_table(runs: list[dict], names: list[str], warm: int, level: float, confidence: float = 0.95) -> str:
    """`--ablate`'s table, a diagnostic: each on state (full, and each ablation: PrismTrace with one part taken away)
    paired with the off blocks either side of it in the same run; a part's cost is the full state's overhead less
    its ablation's, in us a step of the off steps' median."""
    from prism.bench.interleave_rank import ABLATIONS

    def pooled(which):
        parts = [stats.interleaved(r["durations"], r["on"], warm, level, which) for r in runs]
        return stats.Interleaved([x for p in parts for x in p.ratios], [x for p in parts for x in p.changed],
                                 [x for p in parts for x in p.on_steps], [x for p in parts for x in p.off_steps],
                                 level)

    full = pooled(True)
    off = statistics.median(full.off_steps) if full.off_steps else float("nan")
    lines = ["", "DIAGNOSTIC, not the product's number: ablations (`--ablate`): the on blocks take turns between full "
             "PrismTrace and PrismTrace with one part taken away, each paired with the off blocks either side in this "
             f"run (off steps' median {off:.3f} ms); a part's cost = full's overhead - the ablation's",
             f"{'on state':<12} {'steps':>6} {'median ms':>10} {'pairs':>6} {'overhead':>9} {'interval':>19} "
             f"{'us/step':>8} {'events/step':>12} {'part us/step':>13}  what is taken away"]
    for name in (True, *names):
        res = pooled(name)
        ev = [e for r in runs for e, o in zip(r["events"][warm:], r["on"][warm:]) if o == name]
        label = "full" if name is True else f"-{name}"
        if not res.ratios:
            lines.append(f"{label:<12} {len(res.on_steps):>6} {'':>10} {0:>6}  no complete pair")
            continue
        lo, hi, _ = res.ci(confidence)
        interval = f"{100 * lo:+.2f} .. {100 * hi:+.2f} %" if lo != float("-inf") else "too few"
        part = "" if name is True or not full.ratios else f"{(full.overhead - res.overhead) * off * 1e3:+13.0f}"
        lines.append(f"{label:<12} {len(res.on_steps):>6} {statistics.median(res.on_steps):10.3f} {len(res.ratios):>6} "
                     f"{100 * res.overhead:+8.2f}% {interval:>19} {res.overhead * off * 1e3:+8.0f} "
                     f"{statistics.median(ev) if ev else 0:12.0f} {part:>13}  "
                     + ("what real mode records" if name is True
                        else "; ".join(ABLATIONS[p].what for p in name.split("+"))))
    return "\n".join(lines)


def ranks_cores(work: Path, nproc: int) -> list[list[int]]:
    """The cores each rank of the run in `work` could run on, as the rank recorded them (the driver's)."""
    return [json.loads((work / "times" / f"rank{r}.cores.json").read_text()) for r in range(nproc)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=None,
                        help="interleaved rounds of the three variants (default 3); with --interleave: processes, "
                             "their pairs pooled (default 1)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--workload", default="--dp 2 --ep 2 --microbatches 4",
                        help="reference workload flags")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the workload runs and what PrismTrace's device clock is")
    parser.add_argument("--cores", default=None,
                        help="comma-separated cores every run's ranks are pinned to, in rank order (default: the "
                             "last NPROC of this process's affinity)")
    parser.add_argument("--interleave", action="store_true",
                        help="one process (W ranks) with PrismTrace switched off and on every --block steps, each "
                             "on block against the off blocks either side (cancels the host's speed level)")
    parser.add_argument("--block", type=int, default=1, help="--interleave: steps a block")
    parser.add_argument("--level", type=float, default=10.0,
                        help="--interleave: two off blocks this many %% apart count as a change of the host's level")
    parser.add_argument("--ablate", default="",
                        help="--interleave, a diagnostic: comma-separated parts of PrismTrace (memory, events, "
                             "markers, bwd, cpuclock; uncut: the recorder without session 17's cuts; A+B: both) each "
                             "taken away in its own on blocks, taking turns with full "
                             "PrismTrace in the same run; prints what each part costs")
    parser.add_argument("--goal", type=float, default=None,
                        help="--interleave: say whether the overhead's interval lies below this %% (e.g. 3)")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.interleave else 3
    if args.block < 1 or args.repeats < 1:
        parser.error("--block and --repeats must be 1 or more")
    from prism.bench.interleave_rank import ABLATIONS

    ablate = [a for a in args.ablate.split(",") if a]
    if ablate and not args.interleave:
        parser.error("--ablate needs --interleave")
    if [p for a in ablate for p in a.split("+") if p not in ABLATIONS]:
        parser.error(f"--ablate {args.ablate}: each one of {', '.join(ABLATIONS)} (or several joined by +)")
    try:
        given = [int(c) for c in args.cores.split(",")] if args.cores else None
    except ValueError:
        parser.error(f"--cores {args.cores}: not a comma-separated list of core numbers (e.g. --cores 15)")
    try:
        cores = stats.choose_cores(os.sched_getaffinity(0), args.nproc, given)
    except ValueError as exc:
        parser.error(str(exc))
    if args.interleave and args.steps < interleave_warmup(args.block) + 3 * args.block:
        parser.error(f"--steps {args.steps} leaves no pair after the {interleave_warmup(args.block)} warm-up steps "
                     f"(a pair is an off, an on and an off block of --block {args.block}): give --steps "
                     f"{interleave_warmup(args.block) + 3 * args.block} or more")
    if not args.interleave and args.steps - warmup_steps(args.steps) - 1 < 1:
        parser.error(f"--steps {args.steps} leaves no iteration time after the {warmup_steps(args.steps)} "
                     "warm-up step(s) (a time is the gap between two step ends): give --steps 3 or more")
    workload = ["-m", "prism.workloads.moe_gpt", "--steps", str(args.steps)] + args.workload.split()
    where = "CPU"
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("prism bench overhead: --device cuda but no CUDA device is visible here; run it on a GPU "
                  "host or use --device cpu", file=sys.stderr)
            return 2
        gpus = torch.cuda.device_count()
        backend = "nccl" if gpus >= args.nproc else "gloo"  # NCCL needs a GPU per rank
        workload += ["--device", "cuda", "--backend", backend]
        os.environ[settings.DEVICE.name] = "cuda"
        where = f"{torch.cuda.get_device_name(0)} x{min(gpus, args.nproc)}, {backend}"
    if args.interleave:
        runs = []
        with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
            for rep in range(args.repeats):
                run = run_interleaved(Path(tmp) / f"interleave-{rep}", args.nproc, workload, args.block, cores,
                                      ablate)
                runs.append(run)
                for name, flag in (("off", False), ("on", True), *((f"-{a}", a) for a in ablate)):
                    d = [t for t, o in zip(run["durations"], run["on"]) if o == flag]
                    print(f"  process {rep + 1}/{args.repeats} {name:<8} median {statistics.median(d):8.3f} ms "
                          f"over {len(d)} steps", file=sys.stderr, flush=True)
        print(interleave_report(runs, where, args.nproc, cores, workload, args.steps, args.block,
                                interleave_warmup(args.block), args.level / 100,
                                None if args.goal is None else args.goal / 100))
        return 0
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_run: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    written: dict[str, list[int]] = {v: [] for v in VARIANTS}
    seen: set[tuple[int, ...]] = set()
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        for rep in range(args.repeats):
            for variant in stats.round_order(VARIANTS, rep):
                work = Path(tmp) / f"{variant}-{rep}"
                durations, nbytes = run_variant(variant, work, args.nproc, workload, args.steps, cores=cores)
                seen.update(tuple(c) for c in ranks_cores(work, args.nproc))
                results[variant] += durations
                per_run[variant].append(durations)
                written[variant].append(nbytes)
                print(f"  round {rep + 1}/{args.repeats} {variant:<11} median "
                      f"{statistics.median(durations):8.3f} ms", file=sys.stderr, flush=True)
    base = statistics.median(results["none"])
    pinned = ",".join(map(str, cores))
    print(f"\nprism bench overhead: {where}, W={args.nproc} pinned to core(s) {pinned} in every run, "
          f"workload `{' '.join(workload[2:])}`, "
          f"{args.repeats} interleaved rounds, iterations after warm-up per variant: "
          f"{len(results['none'])}")
    print(f"{'variant':<12} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'overhead':>9} "
          f"{'bytes/iter':>12} {'bytes vs PrismTrace':>20}")
    trace_bytes = statistics.median(written["prismtrace"]) / args.steps
    for variant in VARIANTS:
        d = sorted(results[variant])
        med = statistics.median(d)
        per_iter = statistics.median(written[variant]) / args.steps
        ratio = "" if variant == "none" or not trace_bytes else f"{per_iter / trace_bytes:.1f}x"
        print(f"{variant:<12} {med:10.3f} {d[len(d) // 10]:8.3f} {d[9 * len(d) // 10]:8.3f} "
              f"{100 * (med / base - 1):+8.2f}% {per_iter:12,.0f} {ratio:>20}")
    print(paired_report(per_run, args.repeats, cores, seen))
    return 0


def paired_report(per_run: dict[str, list[list[float]]], repeats: int, cores: list[int],
                  seen: set[tuple[int, ...]]) -> str:
    """Each round's run medians and each variant's ratio to that round's baseline run, the median and spread of
    those ratios, the cores the ranks recorded, and a warning where the rounds cannot show the overhead."""
    pairs = stats.paired(per_run)
    meds = {v: stats.run_medians(runs) for v, runs in per_run.items()}
    others = [v for v in VARIANTS if v != "none"]
    lines = ["", "each round's run medians (ms) and each variant's ratio to the none run of its round:",
             f"{'round':<6} {'order':<28}" + "".join(f" {v:>11}" for v in VARIANTS)
             + "".join(f" {v + '/none':>16}" for v in others)]
    for rep in range(repeats):
        lines.append(f"{rep + 1:<6} {' '.join(stats.round_order(VARIANTS, rep)):<28}"
                     + "".join(f" {meds[v][rep]:11.3f}" for v in VARIANTS)
                     + "".join(f" {100 * (pairs[v].ratios[rep] - 1):+15.2f}%" for v in others))
    spread = stats.level_spread(per_run["none"])
    lines.append(f"paired overhead (median over {repeats} round(s) of the round's ratio; min .. max): "
                 + "; ".join(f"{v} {100 * p.overhead:+.2f}% ({100 * (min(p.ratios) - 1):+.2f} .. "
                             f"{100 * (max(p.ratios) - 1):+.2f})" for v, p in pairs.items())
                 + f"; none's run medians {100 * spread:.1f} % apart")
    recorded = sorted(seen)
    expected = [tuple([c]) for c in cores]
    lines.append(f"cores the ranks recorded (affinity): {recorded}"
                 + ("" if recorded == sorted(expected) else f" - not the pinned {cores}: the runs are not comparable"))
    lines += [f"warning: {w}" for w in (stats.verdict(p, spread) for p in pairs.values()) if w]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
