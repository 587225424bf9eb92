"""`prism bench overhead`: what recording costs. The reference workload (W=2, pinned) three ways —
no recording (no interception at all), PrismTrace (`--mode real --out`), and torch.profiler with a Kineto
JSON export — run interleaved (A B C, A B C, ...). Prints the median iteration time of each, the overhead
ratios against no recording, and the bytes each writes per iteration.

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
from prism.runtime.launch import launcher

DRIVER = Path(__file__).with_name("driver.py")
VARIANTS = ("none", "prismtrace", "profiler")


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def warmup_steps(steps: int) -> int:
    """The first iterations left out of the medians (the first step's lazy initialisations)."""
    return max(1, steps // 5)


def run_variant(variant: str, work: Path, nproc: int, workload: list[str], steps: int,
                wrap: list[str] = ()) -> tuple[list[float], int]:
    """One run; returns (per-iteration times in ms after warm-up, bytes written). `wrap`: a program (and its
    arguments) each rank runs instead of the driver, that runs the driver in turn (a profiler's)."""
    times = work / "times"
    profile = work / "profile"
    out = work / "job"
    for d in (times, profile):
        d.mkdir(parents=True)
    prog = [*wrap, str(DRIVER), "--times", str(times)]
    if variant == "profiler":
        prog += ["--profile", str(profile)]
    prog += workload
    spec = launcher.LaunchSpec(nproc=nproc, script=prog[0], args=prog[1:], pin=True,
                               mode="real" if variant == "prismtrace" else "off",
                               out=out if variant == "prismtrace" else None)
    saved = os.dup(1)  # the workload's loss lines are not the benchmark's output
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        code = launcher.launch(spec)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the three variants")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--workload", default="--dp 2 --ep 2 --microbatches 4",
                        help="reference workload flags")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the workload runs and what PrismTrace's device clock is")
    args = parser.parse_args(argv)
    if args.steps - warmup_steps(args.steps) - 1 < 1:
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
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    written: dict[str, list[int]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="prism-bench-") as tmp:
        for rep in range(args.repeats):
            for variant in VARIANTS:
                work = Path(tmp) / f"{variant}-{rep}"
                durations, nbytes = run_variant(variant, work, args.nproc, workload, args.steps)
                results[variant] += durations
                written[variant].append(nbytes)
                print(f"  round {rep + 1}/{args.repeats} {variant:<11} median "
                      f"{statistics.median(durations):8.3f} ms", file=sys.stderr, flush=True)
    base = statistics.median(results["none"])
    print(f"\nprism bench overhead: {where}, W={args.nproc} pinned, workload `{' '.join(workload[2:])}`, "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
