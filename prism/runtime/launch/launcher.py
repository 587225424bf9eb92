"""`prism launch`: runs the job a `LaunchSpec` describes, its ranks forked from a warm zygote.

What can be asked for, how it is checked (exit code 2, before any rank starts) and the usage text of
`prism launch --help`: `launch_spec`. Here: the machine's limits, the run's temporaries and staging folders,
the ranks' environment, the zygote (`python -m prism.runtime.launch.zygote`) and the signals passed to it, and,
when every rank succeeded, `--out`'s raw/ (with meta.json), payloads/ and logs/ put in place by renames.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from prism import job_paths, schemas, settings
from prism.runtime import modes, named_boundaries, oom, watchdog
from prism.runtime.launch import cores
from prism.runtime.launch import limits
from prism.runtime.launch import progress
from prism.runtime.launch import stall
from prism.runtime.launch import run_files
from prism.runtime.launch import zygote_template
from prism.runtime.launch.launch_spec import LaunchError, LaunchSpec, parse, timed_graph, validate
from prism.runtime.launch.zygote_spec import ZygoteSpec

SITE_DIR = Path(__file__).resolve().parents[1] / "site"
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
SLICE_LAZY_GLOO_FROM = 64  # slice mode: above this W, gloo connects lazily (TORCH_GLOO_LAZY_INIT)
HANG_EXIT = watchdog.HANG_EXIT_CODE  # a detected hang: distinct from a program's own small exit codes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec: LaunchSpec) -> int:
    """Run the job; returns the exit code (0: every rank succeeded)."""
    validate(spec)
    mode = modes.get(spec.mode)
    if spec.nnodes > 1:  # a capture or emulation over hosts: this host's share, the rendezvous, the same run
        return _launch_host(spec)
    try:  # the machine's limits (open files, processes, memory, /dev/shm), before anything starts
        limits.check_start(len(spec.slice_ranks) + 1 if mode.replay else spec.nproc, spec.mode,
                           run_files.SHM_ROOT if mode.coordinator else None)
    except limits.LimitError as exc:
        raise LaunchError(str(exc)) from None
    run_id = uuid.uuid4().hex
    run_files.sweep_temporaries()
    try:
        out = run_files.OutFolder(spec.out, spec.force) if spec.out is not None else None
    except run_files.OutError as exc:
        raise LaunchError(str(exc)) from None
    try:  # the cores its ranks are pinned to: no other prism run pins to them meanwhile (`cores`)
        claim = cores.CoreClaim(cores.needed(spec.mode, spec.nproc, spec.pin, spec.devices, spec.slice_ranks),
                                f"prism launch --mode {spec.mode}", spec.pin_cores or None)
    except (cores.CoresBusy, OSError) as exc:
        if out is not None:
            out.release(failed=True)
        raise LaunchError(str(exc)) from None
    signals = _SignalForwarder()
    code = 1
    try:
        code = _run(spec, run_id, signals, cores=claim.cores)
    finally:
        signals.restore()
        claim.release()
        if out is not None:
            out.release(failed=code != 0)
    return code


class _SignalForwarder:
    """SIGTERM (what SLURM and Snakemake send) and SIGINT are passed to the zygote, which stops the ranks;
    the launcher then removes the run's temporaries and exits 128+N, as after a failure."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.proc: subprocess.Popen | zygote_template.TemplateZygote | None = None
        self.previous = {}
        try:
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._on_signal)
        except ValueError:  # not the main thread: signals stay as they are
            self.restore()

    def _on_signal(self, signum, _frame) -> None:
        self.received = signum
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            if handler is not None:  # None: installed outside Python, cannot be put back
                signal.signal(sig, handler)
        self.previous = {}


def _launch_host(spec: LaunchSpec) -> int:
    from prism.runtime.launch import host_launch

    run_files.sweep_temporaries()
    error = host_launch.share_error(spec, run_files.SHM_ROOT)
    hosts_run, run_id, out = host_launch.prepare(spec, error)
    signals = _SignalForwarder()
    code = 1
    try:
        code = _run(spec, run_id, signals, hosts_run)
    finally:
        signals.restore()
        if out is not None:
            out.release(failed=code != 0)
    return code


def _run(spec: LaunchSpec, run_id: str, signals: _SignalForwarder, hosts_run=None, cores: list[int] = ()) -> int:
    tag = run_files.temp_tag(run_id) + (hosts_run.staging_suffix() if hosts_run else "")
    status_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    staging = payload_staging = shm_dir = log_staging = None
    mode = modes.get(spec.mode)
    code = 1
    try:
        env = _rank_environment(spec, status_dir)
        if hosts_run is not None:  # an emulation's clock offset to host 0
            env.update(hosts_run.rank_env())
        if cores and mode.coordinator:  # capture's device slots: the claimed cores
            env[settings.CORES.name] = ",".join(map(str, cores))
        if mode.intercepted and spec.out is not None:
            staging = spec.out / f".raw.tmp-{tag}"
            staging.mkdir()
            env[settings.OUT.name] = str(staging.resolve())
        if mode.coordinator:  # capture: the data moves through shared memory
            shm_dir = Path(run_files.SHM_ROOT) / tag
            shm_dir.mkdir(parents=True)
            env[settings.SHM_DIR.name] = str(shm_dir)
            if spec.out is not None and spec.payloads:
                payload_staging = spec.out / f".payloads.tmp-{tag}"
                payload_staging.mkdir()
                env[settings.PAYLOADS.name] = str(payload_staging.resolve())
        zspec = ZygoteSpec(
            nproc=spec.nproc, script=spec.script, module=spec.module, args=list(spec.args), pin=spec.pin,
            master_addr="127.0.0.1", master_port=spec.master_port or free_port(), run_id=run_id,
            status_dir=str(status_dir), mode=spec.mode, devices=spec.devices,
            shm_dir=str(shm_dir) if shm_dir else None, preload=list(spec.preload), progress=_progress_style(spec),
            iterations=_iterations_expected(spec), device=settings.DEVICE.get(),
            rank_output=limits.rank_output(spec.nproc, spec.mode),
            device_memory_bytes=int(spec.device_memory_gb * 2**30) if spec.device_memory_gb else None,
            cores=list(cores) or None,
        )
        if hosts_run is not None:  # this host's ranks of the whole job, the rendezvous at host 0
            zspec = dataclasses.replace(zspec, **hosts_run.zygote_spec())
        if mode.sandbox and staging is not None:  # the sandbox ranks' output, also in OUT/logs
            log_staging = spec.out / f".logs.tmp-{tag}"
            log_staging.mkdir()
            zspec.log_dir = str(log_staging.resolve())
            zspec.raw_staging = str(staging.resolve())  # the worker writes raw/replay/ there
        if mode.timed and spec.timed_by is not None:  # the slice's server follows the calibrated timeline
            zspec.timed = [str(timed_graph(spec.timed_by)), str(spec.timed_by.resolve())]
        if mode.timed and staging is not None:  # the slice's server says what it played and when (raw/replay/)
            zspec.raw_staging = str(staging.resolve())
        if mode.replay:
            zspec.ranks, zspec.capture, zspec.pruning = list(spec.slice_ranks), str(spec.capture), spec.pruning
            zspec.prefetch_mb, zspec.steps_limit = spec.prefetch_mb, spec.steps_limit
        spec_file = status_dir / "spec.json"
        zspec.write(spec_file)
        started = time.time()
        zygote = None
        if signals.received is None:
            code, zygote = _supervise_zygote(spec_file, env, signals, status_dir if mode.stall_watch else None,
                                             spec.pin, template=hosts_run is None)
        if signals.received is not None:
            code = 128 + signals.received
        if code == oom.EXIT_CODE and spec.out is not None:  # a finding about the program: written down
            oom.write_finding(status_dir, spec.out, {"world_size": spec.nproc, "mode": spec.mode, "run_id": run_id,
                                                     "device": settings.DEVICE.get(),
                                                     "command": (["-m", spec.module] if spec.module else
                                                                 [spec.script]) + spec.args})

        def publish() -> None:
            stats_file = status_dir / ("replay.done" if mode.replay else "capture_stats.json")
            stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
            if mode.sandbox:  # the worker's numbers and the sandbox ranks' transports'
                stats = {"replay": stats, "ranks": {p.stem.removeprefix("emulate-rank"): json.loads(p.read_text())
                                                    for p in status_dir.glob("emulate-rank*.json")}}
            _publish(staging, spec, run_id, started, stats, {**(hosts_run.meta() if hosts_run else {}),
                                                             "pinned_cores": list(cores), "zygote": zygote})
            if payload_staging is not None:
                _replace_dir(payload_staging, job_paths.payloads_dir(spec.out), run_id)
            if log_staging is not None:
                _replace_dir(log_staging, spec.out / "logs", run_id)

        if hosts_run is not None:  # host 0 publishes every host's ranks once all succeeded
            code = hosts_run.finish(code, staging, payload_staging, publish, log_staging, status_dir)
        elif code == 0 and staging is not None:
            publish()
    finally:
        for folder in (status_dir, shm_dir, staging, payload_staging, log_staging):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return code


def _progress_style(spec: LaunchSpec) -> str | None:
    """"tty" (a line rewritten in place), "log" (a line now and then) or None (no progress: --mode off)."""
    if not modes.get(spec.mode).intercepted:
        return None
    if sys.stderr.isatty():
        return "tty"
    return "log" if spec.progress else None


def _iterations_expected(spec: LaunchSpec) -> int | None:
    """Slice and emulate runs: the iterations the capture's first real rank ended (the progress bar's total)."""
    if spec.capture is None or not spec.slice_ranks or _progress_style(spec) is None:
        return None
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc

    path = job_paths.rank_stream(spec.capture, spec.slice_ranks[0])
    try:
        with pa.OSFile(str(path)) as f:
            ops = ipc.open_stream(f).read_all().column("op")
    except (OSError, pa.ArrowInvalid, KeyError):
        return None  # checked and reported elsewhere: the bar then has no total
    n = pc.sum(pc.equal(ops, "iteration_end")).as_py() or 0
    return min(n, spec.steps_limit) if spec.steps_limit else n


def boundary_functions(spec: LaunchSpec) -> dict[str, str]:
    """The named boundary functions the ranks get: the options', else the environment's, else (slice,
    emulate) the capture's, so that every mode of a job counts its iterations by one rule."""
    chosen = {}
    inherited = {}
    if spec.capture is not None:
        meta = job_paths.meta_path(spec.capture)
        if meta.is_file():
            inherited = json.loads(meta.read_text()).get("boundary_functions") or {}
    for var, value in ((named_boundaries.ITERATION_ENV, spec.iteration_fn),
                       (named_boundaries.MICROBATCH_ENV, spec.microbatch_fn)):
        value = value or os.environ.get(var) or inherited.get(var)
        if value:
            chosen[var] = value
    return chosen


TORCHRUN_OMP_WARNING = (
    "\n*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
    "being overloaded, please further tune the variable for optimal performance in your application as needed. "
    "\n*****************************************")


def _torchrun_defaults(env: dict[str, str], nproc: int, warn: bool = True) -> None:
    """What torchrun (torch/distributed/run.py and its elastic agent) puts in every rank's environment beyond
    the rank's coordinates: one OpenMP thread for a multi-process job unless the user set it (with torchrun's
    warning), and the agent's restart and error-handling variables."""
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        if warn:
            print(TORCHRUN_OMP_WARNING, file=sys.stderr, flush=True)
        env["OMP_NUM_THREADS"] = "1"
    env.update(TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")


def _program_environment(env: dict[str, str]) -> dict[str, str]:
    """This launcher's environment as its zygote gets it before the launch's own variables: prism's site folder
    and package first on PYTHONPATH, no variable an outer run set for its ranks."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE_DIR), str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    for var in settings.launcher_clears():  # what an outer run set for its ranks never leaks into these
        env.pop(var, None)
    return env


def template_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to start a zygote template (`zygote_template.Template.start`) with, so that it fits the
    multi-rank launches of a launcher whose environment is `env` (default: this process's): the zygote's
    environment (`_rank_environment`) without the launch's own variables."""
    env = _program_environment(os.environ if env is None else env)
    _torchrun_defaults(env, nproc=2, warn=False)
    return env


def _rank_environment(spec: LaunchSpec, status_dir: Path) -> dict[str, str]:
    env = _program_environment(os.environ)
    env.pop(named_boundaries.ITERATION_ENV, None)
    env.pop(named_boundaries.MICROBATCH_ENV, None)
    env.update(boundary_functions(spec))
    _torchrun_defaults(env, spec.nproc)
    if spec.hang_timeout is not None:
        env[watchdog.ENV] = str(spec.hang_timeout)
    if spec.rank_memory_gb is not None:
        env[oom.ENV] = str(oom.limit_bytes(spec.rank_memory_gb))
    mode = modes.get(spec.mode)
    if mode.intercepted:
        env[settings.MODE.name] = spec.mode
    if not mode.coordinator and _progress_style(spec) is not None:  # (capture: the coordinator's)
        env[progress.ENV] = str(status_dir)
    if mode.coordinator:
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCH_DIST_INIT_BARRIER="0")
        env[settings.CORES.name] = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    if mode.replay:  # the store is hosted by the supervisor, as in capture
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCH_DIST_INIT_BARRIER="0")
        env.update({settings.CAPTURE.name: str(spec.capture),
                    settings.SLICE_RANKS.name: ",".join(map(str, spec.slice_ranks)),
                    settings.PRUNING.name: str(int(spec.pruning)), settings.STATUS_DIR.name: str(status_dir)})
        if spec.nproc > SLICE_LAZY_GLOO_FROM and "TORCH_GLOO_LAZY_INIT" not in env:
            # a group of W members costs the replay server ~W^2 connections when made eagerly; lazily, only
            # the pairs that ever talk connect (on their first op; set TORCH_GLOO_LAZY_INIT=0 to keep eager)
            env["TORCH_GLOO_LAZY_INIT"] = "1"
    return env


def _supervise_zygote(spec_file: Path, env: dict[str, str], signals: _SignalForwarder,
                      watched: Path | None = None, pin: bool = False, template: bool = False) -> int:
    """Start the zygote and wait for it; returns its exit code and which zygote ran ("new", "template"). A signal
    to the launcher reaches it through `signals`. `watched`: the status folder of a run whose progress is watched
    (`stall`): stalled, it is named, then stopped (exit 86). `template`: fork it from the warm template
    PRISM_ZYGOTE_TEMPLATE names where that fits (`zygote_template`), else a new interpreter."""
    proc = zygote_template.start_zygote(spec_file, env, pin) if template else None
    kind = "template" if proc is not None else "new"
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", "prism.runtime.launch.zygote", str(spec_file)], env=env)
    signals.proc = proc
    watch = stall.StallWatch(proc, watched, stall.timeout_s()) if watched is not None and stall.timeout_s() else None
    try:
        if signals.received is not None:  # arrived while it started
            proc.send_signal(signals.received)
        code = proc.wait()
        if watch is not None and watch.stopped_run:
            code = HANG_EXIT
    finally:
        if watch is not None:
            watch.close()
        signals.proc = None
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return (128 - code if code < 0 else code), kind  # the zygote died of a signal: as a shell reports it


def _replace_dir(staging: Path, final: Path, run_id: str) -> None:
    """Make `staging` the folder `final` (replacing an older one) with renames only."""
    if final.exists():
        trash = final.with_name(f".{final.name}.old-{run_id}")
        final.rename(trash)
        staging.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(final)


def _rank_stats(raw: Path) -> dict:
    """Context-switch cost and logical time, from the ranks' capture statistics."""
    rows = [json.loads(p.read_text()) for p in raw.glob("rank=*/capture_stats.json")]
    if not rows:
        return {}
    switches = sum(r["switches"] for r in rows)
    logical = sorted(r["logical_ns"] for r in rows)
    private = sorted(r.get("private_bytes", 0) for r in rows)
    # at the rank's first wait (its set-up's share: `CaptureClient.private_first_block`; ranks that never waited
    # are left out)
    waited = [r for r in rows if r.get("private_bytes_first_block", -1) >= 0]
    setup = sorted(r["private_bytes_first_block"] for r in waited)
    steps = sorted(r.get("private_bytes", 0) - r["private_bytes_first_block"] for r in waited)
    largest = max(rows, key=lambda r: r.get("private_bytes", 0))
    return {
        "rank_private_mib_median": private[len(private) // 2] / 2**20, "rank_private_mib_max": private[-1] / 2**20,
        "rank_private_setup_mib_median": setup[len(setup) // 2] / 2**20 if setup else None,
        "rank_private_setup_mib_max": setup[-1] / 2**20 if setup else None,
        "rank_private_steps_mib_median": steps[len(steps) // 2] / 2**20 if steps else None,  # end - first wait
        "rank_private_max_rank": largest.get("rank"),
        "switch_cost_us": sum(r["switch_ns"] for r in rows) / switches / 1e3 if switches else None,
        "rank_blocks": sum(r["blocks"] for r in rows),
        "logical_s_min": logical[0] / 1e9, "logical_s_median": logical[len(logical) // 2] / 1e9,
        "logical_s_max": logical[-1] / 1e9,
    }


def _publish(staging: Path, spec: LaunchSpec, run_id: str, started: float, stats: dict,
             extra: dict | None = None) -> None:
    from importlib.metadata import version

    meta = {
        "world_size": spec.nproc, "mode": spec.mode, "hostname": socket.gethostname(),
        "command": (["-m", spec.module] if spec.module else [spec.script]) + spec.args,
        "pin": spec.pin, "cores": len(os.sched_getaffinity(0)), "run_id": run_id,
        "device": settings.DEVICE.get(), "started": started, "wall_s": time.time() - started,
        "torch_version": version("torch"), "schema_version": schemas.SCHEMA_VERSION,
        "boundaries": named_boundaries.rules(boundary_functions(spec)),
        "boundary_functions": boundary_functions(spec),
    }
    mode = modes.get(spec.mode)
    if mode.coordinator:
        meta.update(devices=spec.devices, payloads=spec.payloads, capture={**stats, **_rank_stats(staging)})
    if mode.replay and not mode.sandbox:
        meta.update(slice_ranks=spec.slice_ranks, capture_dir=str(spec.capture), replay=stats,
                    gloo_lazy_init=os.environ.get("TORCH_GLOO_LAZY_INIT",
                                                  "1" if spec.nproc > SLICE_LAZY_GLOO_FROM else "0") == "1")
    if mode.sandbox:
        meta.update(sandbox=spec.slice_ranks, capture_dir=str(spec.capture), devices=spec.devices,
                    t0_ns=stats["replay"].get("t0_ns"), emulation=_emulation_stats(spec, stats))
    meta.update(extra or {})  # a capture over hosts: the job's world size, its hosts, each rank's host
    job_paths.raw_meta(staging).write_text(json.dumps(meta, indent=2) + "\n")
    _replace_dir(staging, job_paths.raw_dir(spec.out), run_id)


def _emulation_stats(spec: LaunchSpec, stats: dict) -> dict:
    """meta.json's `emulation`: the replay worker's numbers plus the sandbox ranks' transports'."""
    replay, ranks = stats["replay"], stats["ranks"].values()
    return {
        "pruning": spec.pruning, "startup_s": replay.get("startup_s"),
        "communicators": replay.get("communicators", 0) + sum(r["communicators"] for r in ranks),
        "worker_communicators": replay.get("communicators", 0),
        "bytes_moved": sum(r["bytes_sent"] for r in ranks) + replay.get("bytes_sent", 0),
        "sandbox_bytes_sent": sum(r["bytes_sent"] for r in ranks),
        "worker_bytes_sent": replay.get("bytes_sent", 0),
        "framing_bytes": sum(r.get("framing_bytes", 0) for r in ranks) + replay.get("framing_bytes", 0),
        "collective_messages": sum(r.get("collective_messages", 0) for r in ranks)
        + replay.get("collective_messages", 0),
        "collectives_replayed": replay.get("collectives", 0), "messages_replayed": replay.get("messages", 0),
        "prefetch": replay.get("prefetch"), "timed": replay.get("timed", False),
        "replayed_events": replay.get("replayed_events", 0), "cone": replay.get("cone"),
        "cuda_folds": sum(r.get("cuda_folds", 0) for r in ranks),  # reductions folded by cuda/fold.cu
        "transfer_holds": sum(r.get("transfer_holds", 0) for r in ranks),  # emulation.hold_until
        "transfer_hold_s": round(sum(r.get("transfer_hold_s", 0.0) for r in ranks), 6),
        # per sandbox rank: its threads' CPU s by kind (`thread_cpu`), where its protocol ops' time went
        "rank_diagnostics": {rank: r.get("diagnostics") for rank, r in stats["ranks"].items()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        spec = parse(argv)
        return launch(spec)
    except LaunchError as exc:
        print(f"prism launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
