"""Where PrismTrace's cost per step goes (issue 21 item 6): the bench's reference workload at W=1 (pinned), with
no recording (variant `none`, `--mode off`) and with PrismTrace (`prismtrace`, `--mode real`, PRISM_DEVICE=DEVICE),
each run through the bench's driver (`prism bench overhead`'s `run_variant`) three times: without a profiler
(the times; PrismTrace also as `prismtrace-nomarkers`: the global hooks patched out, real mode's process groups
alone; as `prismtrace-cpuclock`, PRISM_DEVICE=cpu: no CUDA events, no allocator statistics,
as `prismtrace-noevents`: the CUDA clock's events patched out in the rank, the allocator statistics kept, and as
`prismtrace-flatmem`: the allocator statistics read as before a82c40d, three flattening readers a marker; and as
`prismtrace-timed`: the wall time inside PrismTrace's hooks, markers, memory reads and CUDA events),
under cProfile of the rank for its steps after the warm-up, and under torch.profiler (CPU activities, and CUDA
where there is one) for a few steps.

    python3 scripts/overhead_profile.py OUT [--device cuda] [--steps 15] [--torch-steps 3] [--workload "--microbatches 4"]

Writes to OUT (text, every number per profiled step):
  timed.tsv                        wall time inside PrismTrace's hooks, markers, memory reads, CUDA events per step
  threads.tsv                      each rank thread's CPU ms and context switches per profiled step, and the
                                   cyclic collector's runs and time per step
  steps.tsv                        every run's iteration times (ms), profiled steps marked (the medians: summary)
  <variant>-cprofile-tottime.txt   pstats, top 60 by tottime;  <variant>-cprofile-cumtime.txt  by cumtime
  <variant>-prism-calls.tsv        prism's functions and torch.cuda's: calls, tottime and cumtime per step
  <variant>-torch-ops.txt          torch.profiler key_averages table by self CPU time (top 80)
  <variant>-torch-ops.tsv          every key_averages row per step (name, calls, self CPU us, CPU us, device us)
  <variant>-torch-trace.json.gz    the profiled steps' Chrome trace
  syncs.tsv                        the CUDA runtime calls that wait or copy (and event/launch calls) per step,
                                   both variants side by side
  summary.txt                      the tables above that matter most, in one file
Python 3.12's cProfile (sys.monitoring) also sees the autograd device thread's calls (the backward hooks on
CUDA); 3.11's sees only the main thread's (on CPU the backward runs there too).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import os
import pstats
import runpy
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
# (profiler, variant): first without a profiler (the times), PrismTrace also without its markers (real mode's
# process groups alone), with its CPU clock (no CUDA events, no allocator statistics: what the CUDA clock costs,
# against `prismtrace`), without the CUDA events alone, with the memory probe before a82c40d, and with a clock
# around each of its entry points; then under each profiler
RUNS = (("plain", "none"), ("plain", "prismtrace"), ("plain", "prismtrace-nomarkers"), ("plain", "prismtrace-cpuclock"),
        ("plain", "prismtrace-noevents"), ("plain", "prismtrace-flatmem"), ("plain", "prismtrace-timed"),
        ("cprofile", "none"), ("cprofile", "prismtrace"), ("torch", "none"), ("torch", "prismtrace"))
WAITING = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent",
           "cudaMemcpy", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaEventQuery", "cudaEventRecord",
           "cudaEventRecordWithFlags", "cudaEventElapsedTime", "cudaEventCreateWithFlags", "cudaStreamGetCaptureInfo",
           "cudaStreamIsCapturing", "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
           "cudaGetDevice", "cudaSetDevice", "cudaPointerGetAttributes", "aten::item", "aten::_local_scalar_dense")


# -- in the rank -----------------------------------------------------------------------------------------------
class _NoDeviceClock:
    """Stands in for `recorder._DeviceClock` (variant prismtrace-noevents): no CUDA event, device_ns stays -1."""

    def mark(self):
        return None

    def span(self, index, start, end) -> None:
        pass

    def resolve(self, rows, rank, wait) -> None:
        pass


def thread_times(since: dict | None = None) -> dict[int, tuple[str, float, int, int]]:
    """Each thread of this process: (name, CPU ms, voluntary and involuntary context switches), from /proc
    (minus `since`'s: a thread that shares the rank's one core with the program's shows here)."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        try:  # the scheduler's own count, in ns (utime + stime below count in clock ticks)
            cpu = int((task / "schedstat").read_text().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            cpu = (int(fields[11]) + int(fields[12])) * tick_ms
        vol, invol = int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])
        before = (since or {}).get(int(task.name), (name, 0.0, 0, 0))
        out[int(task.name)] = (name, cpu - before[1], vol - before[2], invol - before[3])
    return out


def time_prism_calls() -> dict[str, list[int]]:
    """Wrap PrismTrace's entry points in this rank (variant prismtrace-timed) with a wall clock: name -> [calls,
    ns inside, inclusive] (the hooks contain the markers, a marker its memory read and CUDA events)."""
    from prism.runtime import markers, recorder
    from prism.runtime.memory import MemoryProbe

    spent: dict[str, list[int]] = {}

    def timed(name, fn):
        cell = spent.setdefault(name, [0, 0])

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                cell[0] += 1
                cell[1] += time.perf_counter_ns() - t0

        return wrapper

    for register in ("register_module_forward_pre_hook", "register_module_forward_hook",
                     "register_optimizer_step_pre_hook", "register_optimizer_step_post_hook"):
        original = getattr(markers, register)
        setattr(markers, register, lambda fn, original=original, name=register: original(
            timed(f"markers hook {name.removeprefix('register_')}", fn)))
    markers._bwd_begin = timed("markers._bwd_begin (a backward's first gradient)", markers._bwd_begin)
    recorder.Recorder.marker = timed("Recorder.marker", recorder.Recorder.marker)
    MemoryProbe.sample = timed("MemoryProbe.sample", MemoryProbe.sample)
    for name in ("mark", "resolve"):
        setattr(recorder._DeviceClock, name, timed(f"_DeviceClock.{name}", getattr(recorder._DeviceClock, name)))
    return spent


def in_rank(kind: str, folder: Path, first: int, count: int, driver_argv: list[str]) -> None:
    """Run the driver with a profiler of `kind` on from the `first`-th optimizer step end to `count` later
    (`plain`: none)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    patch = os.environ.get("OVERHEAD_PROFILE_PATCH", "")
    if patch == "nomarkers":  # real mode's process groups alone: no global hooks, so no marker and no event
        from prism.runtime import markers

        markers.install = lambda rec, on_boundary=None: []
    elif patch == "noevents":  # the Recorder is made at the program's first group: after this
        from prism.runtime import recorder

        recorder._DeviceClock = _NoDeviceClock
    elif patch == "flatmem":  # the memory probe as it was before a82c40d: three flattening readers a marker
        from prism.runtime.memory import MemoryProbe

        def sample(self):
            if self.cuda:
                return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
            return cpu_sample(self)

        cpu_sample, MemoryProbe.sample = MemoryProbe.sample, sample
    spent = time_prism_calls() if patch == "timed" else {}
    state = {"ends": 0, "prof": None, "t0": 0}

    gc_runs = {0: [0, 0], 1: [0, 0], 2: [0, 0]}  # generation -> [collections, ns] inside the window

    def on_gc(phase, info) -> None:
        if phase == "start":
            state["gc_t0"] = time.perf_counter_ns()
        elif "t0" in state and "done" not in state:
            gc_runs[info["generation"]][0] += 1
            gc_runs[info["generation"]][1] += time.perf_counter_ns() - state["gc_t0"]

    gc.callbacks.append(on_gc)

    def start() -> None:
        state["threads"] = thread_times()
        state["spent"] = {name: list(cell) for name, cell in spent.items()}
        if kind == "cprofile":
            import cProfile

            state["prof"] = cProfile.Profile()
            state["prof"].enable()
        elif kind == "torch":
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            state["prof"] = torch.profiler.profile(activities=acts)
            state["prof"].start()
        state["t0"] = time.perf_counter_ns()

    def stop() -> None:  # the tables are written after the run: the steps after the window stay undisturbed
        prof = state["prof"]
        state["wall_ms"] = (time.perf_counter_ns() - state["t0"]) / 1e6
        if kind == "cprofile":
            prof.disable()
        elif kind == "torch":
            prof.stop()
        state["threads"] = thread_times(state["threads"])
        state["spent"] = {name: (cell[0] - state["spent"][name][0], cell[1] - state["spent"][name][1])
                          for name, cell in spent.items()}
        state["done"] = prof

    def on_step(*_):
        state["ends"] += 1
        if state["ends"] == first:
            start()
        elif state["ends"] == first + count and "done" not in state:
            stop()

    # registered before the driver's stamp hook and prism's markers (which come with the first group): a window
    # holds the iteration_end marker of its first step end and not its last one's, `count` of them in all
    register_optimizer_step_post_hook(on_step)
    sys.argv = driver_argv
    runpy.run_path(driver_argv[0], run_name="__main__")
    if "done" not in state:  # the run ended inside the window
        (folder / "window.txt").write_text(f"incomplete: the run ended after {state['ends']} step ends\n")
        return
    prof = state["done"]
    if kind == "cprofile":
        prof.dump_stats(str(folder / "cprofile.pstats"))
    elif kind == "torch":
        write_torch_tables(prof, folder, count)
    lines = ["tid\tthread\tcpu_ms_per_step\tvoluntary_switches_per_step\tinvoluntary_switches_per_step"]
    lines += [f"{tid}\t{name}\t{cpu / count:.3f}\t{vol / count:.1f}\t{invol / count:.1f}"
              for tid, (name, cpu, vol, invol) in sorted(state["threads"].items(), key=lambda kv: -kv[1][1])]
    lines.append("# the collector inside the window: " + ", ".join(
        f"gen{g} {n / count:.2f} runs {ns / 1e6 / count:.3f} ms" for g, (n, ns) in gc_runs.items()) + " per step")
    (folder / "threads.tsv").write_text("\n".join(lines) + "\n")
    if spent:
        rows = ["function\tcalls_per_step\twall_us_per_call\twall_ms_per_step (inclusive)"]
        rows += [f"{name}\t{calls / count:.2f}\t{ns / max(calls, 1) / 1e3:.2f}\t{ns / count / 1e6:.3f}"
                 for name, (calls, ns) in sorted(state["spent"].items(), key=lambda kv: -kv[1][1])]
        (folder / "timed.tsv").write_text("\n".join(rows) + "\n")
    (folder / "window.txt").write_text(f"{count} {state['wall_ms']:.3f}\n")


def write_torch_tables(prof, folder: Path, steps: int) -> None:
    averages = prof.key_averages()
    (folder / "torch-ops.txt").write_text(
        f"# torch.profiler over {steps} steps (totals; divide by {steps} for one step)\n"
        + averages.table(sort_by="self_cpu_time_total", row_limit=80, max_name_column_width=70))
    lines = ["name\tcalls_per_step\tself_cpu_us_per_step\tcpu_us_per_step\tself_device_us_per_step"]
    for e in sorted(averages, key=lambda e: -e.self_cpu_time_total):
        device = getattr(e, "self_device_time_total", None)
        if device is None:
            device = getattr(e, "self_cuda_time_total", 0)
        lines.append(f"{e.key}\t{e.count / steps:.2f}\t{e.self_cpu_time_total / steps:.1f}\t"
                     f"{e.cpu_time_total / steps:.1f}\t{device / steps:.1f}")
    (folder / "torch-ops.tsv").write_text("\n".join(lines) + "\n")
    trace = folder / "torch-trace.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


# -- tables from what the ranks wrote -------------------------------------------------------------------------
def _watched(filename: str, name: str) -> bool:
    """prism's functions, torch.cuda's (memory stats, events, streams) and the clocks' builtins."""
    path = filename.replace("\\", "/")
    return "/prism/" in path or "/torch/cuda/" in path or any(
        w in name for w in ("_cuda_", "thread_time", "monotonic_ns", "getrusage", "pread", "get_ident"))


def prism_rows(stats: pstats.Stats, steps: int) -> list[tuple]:
    """(function, calls/step, tottime us/call, tottime us/step, cumtime us/step), by tottime per step."""
    rows = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():
        if not _watched(filename, name):
            continue
        where = f"{name} ({_short(filename)}:{line})" if line else name
        rows.append((where, calls / steps, 1e6 * tottime / max(calls, 1), 1e6 * tottime / steps,
                     1e6 * cumtime / steps))
    return sorted(rows, key=lambda r: -r[3])


def _short(filename: str) -> str:
    path = filename.replace("\\", "/")
    for root in ("/prism/", "/site-packages/"):
        if root in path:
            return path[path.rindex(root) + 1:]
    return path


def write_cprofile_tables(folder: Path, out: Path, variant: str, steps: int) -> list[tuple]:
    stats = pstats.Stats(str(folder / "cprofile.pstats"))
    for key in ("tottime", "cumtime"):
        buf = io.StringIO()
        pstats.Stats(str(folder / "cprofile.pstats"), stream=buf).sort_stats(key).print_stats(60)
        (out / f"{variant}-cprofile-{key}.txt").write_text(f"# cProfile of the rank over {steps} steps\n" + buf.getvalue())
    rows = prism_rows(stats, steps)
    lines = ["function\tcalls_per_step\ttottime_us_per_call\ttottime_us_per_step\tcumtime_us_per_step"]
    lines += [f"{r[0]}\t{r[1]:.2f}\t{r[2]:.2f}\t{r[3]:.1f}\t{r[4]:.1f}" for r in rows]
    (out / f"{variant}-prism-calls.tsv").write_text("\n".join(lines) + "\n")
    return rows


def read_torch_rows(path: Path) -> dict[str, tuple[float, float]]:
    """name -> (calls per step, self CPU us per step) from a torch-ops.tsv."""
    rows = {}
    for line in path.read_text().splitlines()[1:]:
        name, calls, self_cpu, *_ = line.split("\t")
        rows[name] = (float(calls), float(self_cpu))
    return rows


def sync_table(per_variant: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """The waiting / copying / event / launch calls per step of each variant, side by side."""
    head = "name\t" + "\t".join(f"{v}_calls_per_step\t{v}_self_cpu_us_per_step" for v in per_variant)
    lines = [head]
    names = [n for n in WAITING if any(n in rows for rows in per_variant.values())]
    names += sorted({n for rows in per_variant.values() for n in rows
                     if n.startswith("cuda") and n not in names})
    for name in names:
        cells = []
        for rows in per_variant.values():
            calls, cpu = rows.get(name, (0.0, 0.0))
            cells.append(f"{calls:.2f}\t{cpu:.1f}")
        lines.append(f"{name}\t" + "\t".join(cells))
    return lines


def write_tables(out: Path, notes: list[str], steps_lines: list[str], threads: dict, timed_rows: list[str],
                 torch_rows: dict, prism_tables: dict) -> list[str]:
    """steps.tsv, threads.tsv, syncs.tsv and summary.txt from the runs so far (rewritten after each run: a call
    stopped at its budget keeps what was measured); returns the summary's lines."""
    summary = list(notes)
    (out / "steps.tsv").write_text("\n".join(steps_lines) + "\n")
    (out / "threads.tsv").write_text("".join(f"# {run}\n" + "\n".join(lines) + "\n" for run, lines in threads.items()))
    summary += ["", "== the rank's threads over the profiled steps, runs without a profiler (threads.tsv: all runs; the "
                "rank is pinned to one core: another thread's CPU time and the main thread's involuntary switches "
                "are time taken from the program)"]
    for run, lines in threads.items():
        if run.startswith("plain"):
            summary += [f"-- {run}"] + lines[:9] + lines[-1:]
    syncs = sync_table(torch_rows)
    (out / "syncs.tsv").write_text("\n".join(syncs) + "\n")
    summary += ["", "== wall time inside PrismTrace's entry points per profiled step (prismtrace-timed, timed.tsv: each "
                "wrapped in a clock in the rank, inclusive)"] + timed_rows
    summary += ["", "== CUDA runtime calls that wait, copy, record or launch, per step (torch.profiler; syncs.tsv)"]
    summary += syncs
    summary += ["", "== PrismTrace: prism's functions (not the workload's) and torch.cuda's by tottime per step (top 40 "
                "of prismtrace-prism-calls.tsv; cProfile inflates each call by its own cost)",
                "function\tcalls/step\ttottime us/call\ttottime us/step\tcumtime us/step"]
    runtime = [r for r in prism_tables.get("prismtrace", []) if "prism/workloads/" not in r[0]]  # the workload's: both
    summary += [f"{r[0]}\t{r[1]:.2f}\t{r[2]:.2f}\t{r[3]:.1f}\t{r[4]:.1f}" for r in runtime[:40]]
    summary += ["", "== the top 30 ops by self CPU time per step, each variant (torch.profiler)"]
    for variant, rows in torch_rows.items():
        summary.append(f"-- {variant}: name\tcalls/step\tself CPU us/step")
        top = sorted(rows.items(), key=lambda kv: -kv[1][1])[:30]
        summary += [f"{name}\t{calls:.2f}\t{cpu:.1f}" for name, (calls, cpu) in top]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return summary


# -- the runs --------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-rank"]:
        kind, folder, first, count = argv[1], Path(argv[2]), int(argv[3]), int(argv[4])
        in_rank(kind, folder, first, count, argv[5:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=15, help="training steps of each run")
    parser.add_argument("--torch-steps", type=int, default=3, help="steps under torch.profiler")
    parser.add_argument("--workload", default="--microbatches 4", help="reference workload flags")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent.parent))
    from prism import settings
    from prism.bench import overhead

    warm = overhead.warmup_steps(args.steps)
    windows = {"plain": args.steps - warm - 1, "cprofile": args.steps - warm - 1,
               "torch": min(args.torch_steps, args.steps - warm - 1)}
    if windows["torch"] < 1:
        parser.error(f"--steps {args.steps} leaves no step to profile after the {warm} warm-up step(s)")
    workload = ["-m", "prism.workloads.moe_gpt", "--steps", str(args.steps)] + args.workload.split()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("overhead_profile: --device cuda but no CUDA device is visible (CUDA_VISIBLE_DEVICES?)",
                  file=sys.stderr)
            return 2
        workload += ["--device", "cuda", "--backend", "nccl"]
        os.environ[settings.DEVICE.name] = "cuda"  # as the bench does: PrismTrace's CUDA clock and memory
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps_lines = ["variant\tprofiler\tstep\tms\tprofiled"]
    summary = [f"overhead_profile: device {args.device}, W=1 pinned, workload `{' '.join(workload[2:])}`, "
               f"warm-up {warm} steps; cProfile over {windows['cprofile']} steps, torch.profiler over "
               f"{windows['torch']} steps (from the first step after the warm-up)", ""]
    torch_rows, prism_tables, plain, threads, timed_rows = {}, {}, {}, {}, []
    with tempfile.TemporaryDirectory(prefix="prism-ovh-") as tmp:
        for kind, variant in RUNS:
            folder = Path(tmp) / f"{variant}-{kind}"
            folder.mkdir()
            wrap = [str(HERE), "--in-rank", kind, str(folder), str(warm + 1), str(windows[kind])]
            clock = os.environ.get(settings.DEVICE.name)
            if variant == "prismtrace-cpuclock":  # PrismTrace without the CUDA events and allocator stats
                os.environ[settings.DEVICE.name] = "cpu"
            os.environ["OVERHEAD_PROFILE_PATCH"] = variant.removeprefix("prismtrace-")  # noevents, flatmem
            t0 = time.monotonic()
            try:
                durations, _ = overhead.run_variant(variant.split("-")[0], Path(tmp) / f"run-{variant}-{kind}", 1,
                                                    workload, args.steps, wrap=wrap)
            except RuntimeError as exc:  # one failed run: the others still say something
                summary.append(f"{kind:<8} {variant:<20} FAILED: {exc}")
                print(summary[-1], file=sys.stderr, flush=True)
                continue
            finally:
                if clock is None:
                    os.environ.pop(settings.DEVICE.name, None)
                else:
                    os.environ[settings.DEVICE.name] = clock
            window = windows[kind]
            for k, ms in enumerate(durations):  # step warm+k+2 (its end minus the previous step's end)
                steps_lines.append(f"{variant}\t{kind}\t{warm + k + 2}\t{ms:.3f}\t{int(k < window)}")
            median = statistics.median(durations)
            seen = (folder / "window.txt").read_text().split() if (folder / "window.txt").exists() else []
            note = f"{kind:<8} {variant:<20} run {time.monotonic() - t0:6.1f} s, median step {median:8.3f} ms"
            if kind == "plain":
                plain[variant] = median
                base = plain.get("none")
                note += f" ({100 * (median / base - 1):+.1f} % vs none)" if base and variant != "none" else ""
            else:
                note += f", profiled window: {' '.join(seen)} (steps, ms)"
            print(note, file=sys.stderr, flush=True)
            summary.append(note)
            if (folder / "timed.tsv").exists():
                timed_rows = (folder / "timed.tsv").read_text().splitlines()
                shutil.copy(folder / "timed.tsv", out / "timed.tsv")
            if (folder / "threads.tsv").exists():
                threads[f"{kind} {variant}"] = (folder / "threads.tsv").read_text().splitlines()
            if kind == "cprofile" and (folder / "cprofile.pstats").exists():
                prism_tables[variant] = write_cprofile_tables(folder, out, variant, windows[kind])
            elif kind == "torch" and (folder / "torch-ops.tsv").exists():
                for name in ("torch-ops.txt", "torch-ops.tsv", "torch-trace.json.gz"):
                    shutil.copy(folder / name, out / f"{variant}-{name}")
                torch_rows[variant] = read_torch_rows(folder / "torch-ops.tsv")
            write_tables(out, summary, steps_lines, threads, timed_rows, torch_rows, prism_tables)
    print("\n".join(write_tables(out, summary, steps_lines, threads, timed_rows, torch_rows, prism_tables)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
