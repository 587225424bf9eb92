"""`prism launch`: a torchrun-compatible launcher that runs W ranks forked from a warm zygote.

    prism launch --nproc W [--mode real|capture|off] [--out DIR [--force]] [--pin] (SCRIPT | -m MODULE) [ARGS...]
    prism launch --nproc W --mode slice --slice-ranks 0,1 --capture CAPDIR [--timed-by TIMELINE] [--out DIR] [--pin] ...
    prism launch --nproc W --mode emulate --sandbox 3,17 --capture JOB [--devices P] [--no-pruning] ...
    prism launch --nnodes N --node-rank K --master-addr H0 --master-port PORT --nproc n --mode capture|emulate ...

Mode `slice` forks only the slice's ranks (global RANK, WORLD_SIZE=W) plus a replay server that answers
for every other rank from the capture in CAPDIR (`prism launch --mode capture --out CAPDIR`); with
`--timed-by` the replayed ranks answer at their times in a calibrated timeline (`prism.runtime.slice.replay_server`).
Mode `emulate` forks only the sandbox ranks plus one replay worker (`prism.runtime.emulate.transport`): the
sandbox's collectives compute prism's semantics over its live contributions and the virtual ranks'
recorded ones (pruned: one compensating peer per run of consecutive virtual members).

Everything a user can get wrong is checked here, before any rank starts (exit code 2); the program checks
its own arguments in its ranks (a rank exiting with code 2 is reported once, as a usage error). With `--out`,
the ranks' PrismTrace goes to a staging folder that becomes `DIR/raw` only when every rank succeeded, so a
failed run leaves no partial artifact.

`--out DIR` must be empty (a job folder holds one run: an older run's graph/ or slices/ would be mixed with
this one's) unless `--force`, which clears it; a lock (`DIR/.prism.lock`) refuses a second launch into DIR
while one runs. `raw/meta.json` carries a `run_id` that identifies this run.

Exit codes: 0 every rank succeeded; 2 bad input (one message, nothing started or written); 86
(`HANG_EXIT`) the job hangs (capture: no rank can run, or the members of a collective disagree; real: no op
completed on any rank for --hang-timeout seconds) and the message says which ranks wait where; 128+N the launcher got signal N (SIGTERM
or SIGINT: the ranks are stopped and the run's temporaries removed); otherwise the first failed rank's code.
Temporaries carry the launcher's pid in their names (`/dev/shm/prism-<pid>-<id>`, `/tmp/prism-<pid>-<id>-*`,
`DIR/.raw.tmp-<pid>-<id>`): each launch first removes those of launchers that are no longer alive.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from prism import job_paths, settings
from prism.runtime import modes, named_boundaries, oom, watchdog
from prism.runtime.launch.progress import LOG_PERIOD_S

MODES = tuple(modes.MODES)


class LaunchError(Exception):
    """A mistake in what the user asked for: printed as one message, exit code 2."""


@dataclass
class LaunchSpec:
    nproc: int
    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    mode: str = "real"
    out: Path | None = None
    pin: bool = False
    pin_cores: list[int] = field(default_factory=list)  # pinned: exactly these cores, in order (default: the first free)
    master_port: int = 0
    devices: int | None = None  # capture: device slots P (None: every core)
    payloads: bool = True  # capture: keep every contribution for the later modes
    preload: list[str] = field(default_factory=list)  # modules imported once in the zygote
    slice_ranks: list[int] = field(default_factory=list)  # slice: the ranks that run for real
    capture: Path | None = None  # slice, emulate: the capture folder the replay process answers from
    timed_by: Path | None = None  # slice: a calibrated timeline.parquet that times the replay (graph/ beside it)
    pruning: bool = True  # emulate: one compensator per run of virtual members (False: one peer each)
    prefetch_mb: int = 256  # emulate: payload pool of the replay worker
    steps_limit: int | None = None  # emulate: replay only the first N iterations
    force: bool = False  # --out may hold files: clear them
    progress: bool = False  # capture: a progress line on stderr even when it is not a terminal
    hang_timeout: float | None = None  # real: seconds without a completed op before a hang is named
    rank_memory_gb: float | None = None  # CUDA: each rank's device-memory limit (a smaller card; prism/runtime/oom.py)
    device_memory_gb: float | None = None  # capture on CUDA: device capacity for the ranks' state (swapping)
    nnodes: int = 1  # capture over hosts (`prism.runtime.launch.hosts`): one launcher a host, --nproc ranks each
    node_rank: int = 0
    master_addr: str | None = None
    iteration_fn: str | None = None  # MODULE:QUALNAME whose outermost call is one iteration (named_boundaries)
    microbatch_fn: str | None = None  # MODULE:QUALNAME whose outermost call is one microbatch


def parse(argv: list[str]) -> LaunchSpec:
    """Split `argv` at the program (SCRIPT or -m MODULE): options before it are prism's."""
    split = None
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-m" or tok == "--module":
            split = i
            break
        if tok in ("--nproc", "--nproc-per-node", "--mode", "--out", "--master-port", "--devices", "--preload",
                   "--slice-ranks", "--capture", "--sandbox", "--prefetch-mb", "--steps-limit", "--timed-by",
                   "--hang-timeout", "--rank-memory-gb", "--device-memory-gb", "--nnodes", "--node-rank",
                   "--master-addr", "--iteration-fn", "--microbatch-fn"):
            i += 2
            continue
        if not tok.startswith("-"):
            split = i
            break
        i += 1
    # this module's docstring is `prism launch --help`'s text
    parser = argparse.ArgumentParser(prog="prism launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", "--nproc-per-node", type=int, required=True, help="number of ranks W")
    parser.add_argument("--mode", default="real", choices=MODES,
                        help="real: record PrismTrace over the real backend; capture: run W ranks on "
                             "--devices slots through the coordinator; slice: run --slice-ranks for real, "
                             "the other ranks replayed from --capture; off: no interception")
    parser.add_argument("--slice-ranks", default="", help="slice: comma-separated global ranks to run for real")
    parser.add_argument("--sandbox", default="", help="emulate: comma-separated global ranks that run the real "
                                                      "program inside the replayed job")
    parser.add_argument("--no-pruning", action="store_true",
                        help="emulate: every virtual member of a group is its own peer (no compensators)")
    parser.add_argument("--prefetch-mb", type=int, default=256, help="emulate: payload prefetch pool (MiB)")
    parser.add_argument("--steps-limit", type=int, default=None, help="emulate: replay only N iterations")
    parser.add_argument("--capture", type=Path, default=None,
                        help="slice: the capture folder (raw/ and payloads/) that the replay server answers from")
    parser.add_argument("--timed-by", type=Path, default=None, metavar="TIMELINE",
                        help="slice: replayed ranks answer at their times in this calibrated timeline "
                             "(JOB/<folder>/timeline.parquet; the graph is JOB/graph/events.parquet)")
    parser.add_argument("--devices", type=int, default=None,
                        help="capture: device slots P (CPU: cores; default all cores)")
    parser.add_argument("--preload", default="",
                        help="comma-separated modules to import once in the zygote before forking (modules "
                             "without import side effects; saves their import in every rank)")
    parser.add_argument("--no-payloads", action="store_true",
                        help="capture: do not keep payloads (only the graph is needed)")
    parser.add_argument("--out", type=Path, help="job folder (new or empty): the trace goes to OUT/raw")
    parser.add_argument("--force", action="store_true",
                        help="clear --out first if it holds files (by default a non-empty --out is refused)")
    parser.add_argument("--progress", action="store_true",
                        help="report progress on stderr every "
                             f"{LOG_PERIOD_S:.0f} s (capture: ranks done, communications completed; real, slice, "
                             "emulate: iterations the real ranks ended); on a terminal it is shown in place "
                             "without this flag")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i mod cores, 1 thread")
    parser.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one)")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="capture or emulate over hosts: one launcher a host (torchrun's), each with --nproc "
                             "ranks and its own --devices slots; W = nnodes*nproc; emulate: each host runs the "
                             "--sandbox ranks of its block, host 0 also the replay worker (prism.runtime.launch.hosts)")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="capture or emulate over hosts: this host's number, 0..nnodes-1")
    parser.add_argument("--master-addr", default=None,
                        help="capture or emulate over hosts: host 0's address (it serves the rendezvous at "
                             "--master-port)")
    parser.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                        help=f"real: when no op completed on any rank for S seconds, name the hang and stop "
                             f"(exit {watchdog.HANG_EXIT_CODE}; default ${watchdog.ENV} or "
                             f"{watchdog.DEFAULT_TIMEOUT_S:g}; 0: never)")
    parser.add_argument("--rank-memory-gb", type=float, default=None, metavar="G",
                        help="CUDA: limit each rank's caching allocator to G GiB (models a smaller card); a rank "
                             f"that runs out is reported as a finding, OUT/oom.json, exit {oom.EXIT_CODE}")
    parser.add_argument("--device-memory-gb", type=float, default=None, metavar="G",
                        help="capture on CUDA: device memory for the ranks' state per slot; a blocked rank's "
                             "state goes to host memory (CUDA checkpoint) when a running rank needs the room")
    parser.add_argument("--iteration-fn", default=None, metavar="MODULE:QUALNAME",
                        help="one iteration = one outermost call of this function (default: one outermost optimizer "
                             "step; for programs without an optimizer or with an unusual loop; slice and emulate "
                             "take the capture's)")
    parser.add_argument("--microbatch-fn", default=None, metavar="MODULE:QUALNAME",
                        help="one microbatch = one outermost call of this function (default: the forward of a module "
                             "with trainable parameters, not nested in another forward; a pipeline stage's, once "
                             "per schedule chunk)")
    if split is None:
        parser.parse_args(argv)
        raise LaunchError("no program given: add SCRIPT or -m MODULE after the options "
                          "(e.g. prism launch --nproc 2 -m prism.workloads.moe_gpt)")
    opts = parser.parse_args(argv[:split])
    rest = argv[split:]
    spec = LaunchSpec(nproc=opts.nproc, mode=opts.mode, out=opts.out, pin=opts.pin,
                      master_port=opts.master_port, devices=opts.devices, payloads=not opts.no_payloads,
                      preload=[m for m in opts.preload.split(",") if m], capture=opts.capture,
                      force=opts.force, progress=opts.progress,
                      pruning=not opts.no_pruning, prefetch_mb=opts.prefetch_mb, steps_limit=opts.steps_limit,
                      hang_timeout=opts.hang_timeout, rank_memory_gb=opts.rank_memory_gb,
                      device_memory_gb=opts.device_memory_gb, timed_by=opts.timed_by, nnodes=opts.nnodes,
                      node_rank=opts.node_rank, master_addr=opts.master_addr,
                      iteration_fn=opts.iteration_fn, microbatch_fn=opts.microbatch_fn)
    for option, name in (("--iteration-fn", spec.iteration_fn), ("--microbatch-fn", spec.microbatch_fn)):
        if name is not None:
            try:
                named_boundaries.check(name, option)
            except named_boundaries.BoundaryNameError as exc:
                raise LaunchError(str(exc)) from None
    if opts.sandbox and opts.slice_ranks:
        raise LaunchError("--sandbox (mode emulate) and --slice-ranks (mode slice) exclude each other")
    option, text = ("--sandbox", opts.sandbox) if opts.sandbox else ("--slice-ranks", opts.slice_ranks)
    try:
        spec.slice_ranks = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise LaunchError(f"{option} must be comma-separated rank numbers (got {text!r})") from None
    if rest[0] in ("-m", "--module"):
        if len(rest) < 2:
            raise LaunchError("-m needs a module name (e.g. -m prism.workloads.moe_gpt)")
        spec.module, spec.args = rest[1], rest[2:]
    else:
        spec.script, spec.args = rest[0], rest[1:]
    return spec


def cuda_missing() -> str | None:
    """Why this machine cannot run CUDA ranks, or None. Imports torch in the launcher only (the zygote is
    its own process, started afterwards, so no CUDA state reaches the ranks through a fork)."""
    import torch

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU visible, or no working driver; CUDA_VISIBLE_DEVICES=" \
               f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})"
    return None


def validate(spec: LaunchSpec) -> None:
    """Raise LaunchError naming the cause and the fix."""
    if spec.nproc < 1:
        raise LaunchError(f"--nproc must be at least 1 (got {spec.nproc})")
    mode = modes.get(spec.mode)
    _validate_hosts(spec)
    if spec.hang_timeout is not None and not spec.hang_timeout >= 0:
        raise LaunchError(f"--hang-timeout {spec.hang_timeout:g}: give seconds >= 0 (0 turns the watchdog off)")
    if spec.hang_timeout is not None and not mode.watchdog:
        names = [m.name for m in modes.MODES.values() if m.watchdog]
        watched = ", ".join(names[:-1]) + " and " + names[-1]
        raise LaunchError(f"--hang-timeout belongs to --mode {watched} (--mode {spec.mode} "
                          + ("names a hang by itself)" if mode.coordinator else "has no watchdog yet)"))
    try:
        watchdog.timeout_from_env()
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if spec.rank_memory_gb is not None and not spec.rank_memory_gb > 0:
        raise LaunchError(f"--rank-memory-gb {spec.rank_memory_gb:g}: give a positive size in GiB")
    if spec.rank_memory_gb is not None and (not mode.intercepted or settings.DEVICE.get() != "cuda"):
        raise LaunchError("--rank-memory-gb limits each rank's CUDA caching allocator: set PRISM_DEVICE=cuda "
                          "(and run the program with CUDA tensors) in a mode other than off, or drop it")
    if spec.device_memory_gb is not None:
        if not mode.coordinator:
            raise LaunchError(f"--device-memory-gb is the device capacity that --mode capture shares among "
                              f"blocked ranks; --mode {spec.mode} gives every rank its own device: drop it")
        if settings.DEVICE.get() != "cuda":
            raise LaunchError("--device-memory-gb swaps ranks' CUDA state to host memory: set PRISM_DEVICE=cuda "
                              "(and run the program with CUDA tensors) or drop --device-memory-gb")
        if not spec.device_memory_gb > 0:
            raise LaunchError(f"--device-memory-gb {spec.device_memory_gb:g}: give a positive size in GiB")
        from prism.runtime.capture import cuda_checkpoint

        why = cuda_checkpoint.probe()
        if why is not None:
            raise LaunchError(f"--device-memory-gb: cannot swap device state on this host: {why}")
    if mode.coordinator:
        cores = len(os.sched_getaffinity(0))
        if spec.nproc * spec.nnodes < 2:
            raise LaunchError("capture needs at least 2 ranks (--nproc 1 has nothing to capture: "
                              "run it with --mode real)")
        if spec.devices is None:
            spec.devices = min(cores, spec.nproc)
        if spec.devices < 1 or spec.devices > cores:
            raise LaunchError(f"--devices {spec.devices} is not possible here: this machine has {cores} "
                              f"cores (CPU device slots); use 1..{cores}")
    elif spec.progress and not mode.intercepted:
        raise LaunchError(f"--progress reports what prism records; --mode {spec.mode} records nothing: drop "
                          "--progress or use --mode real")
    if not mode.device_slots and spec.devices is not None:
        raise LaunchError(f"--devices sets the device slots that --mode capture shares among the W ranks (or "
                          f"the sandbox ranks of --mode emulate); --mode {spec.mode} gives every rank its own "
                          "process: drop --devices")
    if mode.needs_capture:
        _validate_slice(spec, mode)
    elif spec.slice_ranks or spec.capture is not None:
        raise LaunchError("--slice-ranks, --sandbox and --capture belong to --mode slice / emulate")
    if spec.timed_by is not None:
        if not mode.timed:
            raise LaunchError(f"--timed-by times a slice run's replayed ranks; --mode {spec.mode} takes no timeline")
        for path, what in ((spec.timed_by, "the calibrated timeline"), (timed_graph(spec.timed_by), "its graph")):
            if not path.is_file():
                raise LaunchError(f"--timed-by {spec.timed_by}: {what} {path} is missing; run the calibrate stage "
                                  "first (prism calibrate --job JOB --out JOB/<folder>)")
    if spec.script is not None:
        if not Path(spec.script).is_file():
            raise LaunchError(f"script not found: {spec.script} (check the path, or use -m MODULE)")
    elif _find_module(spec.module) is None:
        raise LaunchError(f"module not found: {spec.module} (is it installed, or in the current "
                          f"folder {os.getcwd()}?)")
    for name in spec.preload:
        if _find_module(name) is None:
            raise LaunchError(f"--preload: module not found: {name}")
    if spec.force and spec.out is None:
        raise LaunchError("--force clears the --out folder: it needs --out")
    # last: the options' own errors name their cause more precisely (and this one imports torch)
    if settings.DEVICE.get() == "cuda":
        why = cuda_missing()
        if why:
            raise LaunchError(f"PRISM_DEVICE=cuda, but {why}: run on a GPU host, or set PRISM_DEVICE=cpu "
                              "(config: device: cpu) and run the program on CPU tensors")
    if spec.out is not None and spec.out.exists() and not spec.out.is_dir():
        raise LaunchError(f"--out {spec.out} is a file, not a folder; choose another path")


def _validate_hosts(spec: LaunchSpec) -> None:
    """--nnodes/--node-rank/--master-addr: a capture or an emulation over hosts."""
    if spec.nnodes == 1 and spec.node_rank == 0:
        return
    if spec.nnodes < 1:
        raise LaunchError(f"--nnodes must be at least 1 (got {spec.nnodes})")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise LaunchError(f"--node-rank {spec.node_rank} outside 0..{spec.nnodes - 1} (--nnodes {spec.nnodes})")
    if not (modes.get(spec.mode).coordinator or modes.get(spec.mode).sandbox):
        raise LaunchError(f"--nnodes {spec.nnodes} spreads a capture or an emulation over hosts; --mode {spec.mode} "
                          "runs on one host (use --mode capture or emulate, or drop --nnodes)")
    if not spec.master_port:
        raise LaunchError("--nnodes needs --master-port: the port host 0 serves the rendezvous on, the same on every "
                          "host (e.g. --master-port 29500)")
    if not spec.master_addr:
        raise LaunchError("--nnodes needs --master-addr: host 0's address, the same on every host (e.g. "
                          "--master-addr node001)")
    if spec.out is None:
        raise LaunchError("--nnodes needs --out: one job folder that every host sees (a shared file system)")


def timed_graph(timeline: Path) -> Path:
    """The graph events a calibrated timeline (JOB/<folder>/timeline.parquet) belongs to: JOB/graph/events.parquet."""
    return job_paths.graph_file(timeline.resolve().parent.parent)


def _validate_slice(spec: LaunchSpec, mode: modes.Mode) -> None:
    """Slice and emulate: the ranks run for real and the capture the others are replayed from."""
    ranks, world, opt = spec.slice_ranks, spec.nproc * spec.nnodes, mode.ranks_option  # over hosts: the job's W
    if not ranks:
        raise LaunchError(f"--mode {mode.name} needs {opt} (e.g. {opt} 0,1: the ranks that run for real)")
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise LaunchError(f"{opt} {bad} outside 0..{world - 1} (--nproc {spec.nproc}"
                          + (f" x --nnodes {spec.nnodes})" if spec.nnodes > 1 else ")"))
    if len(set(ranks)) != len(ranks):
        raise LaunchError(f"{opt} lists a rank twice: {ranks}")
    cores = len(os.sched_getaffinity(0))
    here = [r for r in ranks if r // spec.nproc == spec.node_rank]  # over hosts: this host's sandbox ranks
    slots = spec.devices if mode.sandbox and spec.devices else max(1, len(here))
    if mode.sandbox and slots < 1:
        raise LaunchError(f"--devices must be at least 1 (got {slots})")
    if slots > cores:
        raise LaunchError(f"{len(here)} ranks on {slots} device slots need {slots} cores; this "
                          f"machine has {cores}: use at most {cores}")
    if mode.sandbox:
        spec.devices = slots
        if spec.prefetch_mb < 0:
            raise LaunchError(f"--prefetch-mb must be >= 0 (0 turns prefetch off; got {spec.prefetch_mb})")
        if spec.steps_limit is not None and spec.steps_limit < 1:
            raise LaunchError(f"--steps-limit must be at least 1 (got {spec.steps_limit})")
    if spec.capture is None:
        raise LaunchError(f"--mode {mode.name} needs --capture CAPDIR (the output folder of "
                          "`prism launch --mode capture`, or a job folder holding it)")
    if mode.sandbox and not job_paths.meta_path(spec.capture).is_file() \
            and job_paths.meta_path(job_paths.capture_dir(spec.capture)).is_file():
        spec.capture = job_paths.capture_dir(spec.capture)  # a job folder: its capture lives in JOB/capture
    meta_path = job_paths.meta_path(spec.capture)
    if not meta_path.is_file():
        raise LaunchError(f"--capture {spec.capture}: no raw/meta.json (not a capture folder, or the capture "
                          "did not finish); run `prism launch --mode capture --out CAPDIR` first")
    meta = json.loads(meta_path.read_text())
    if not modes.captured(meta):
        raise LaunchError(f"--capture {spec.capture}: a {meta.get('mode')!r} run, not a capture")
    if meta.get("world_size") != world:
        asked = f"--nproc {spec.nproc} x --nnodes {spec.nnodes} is {world}" if spec.nnodes > 1 else f"--nproc is {world}"
        raise LaunchError(f"--capture {spec.capture} has {meta.get('world_size')} ranks, {asked}: "
                          f"{'an emulation' if mode.sandbox else 'a slice'} runs the captured job at its own size")
    if not meta.get("payloads", False) or not job_paths.payloads_dir(spec.capture).is_dir():
        raise LaunchError(f"--capture {spec.capture} has no payloads (captured with --no-payloads): "
                          "capture again with payloads")
    spec.capture = spec.capture.resolve()


def _find_module(name: str):
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path.pop(0)
