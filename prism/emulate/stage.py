"""The emulate stage: chosen sandbox ranks run the job's real program inside the replayed W-rank job.

    prism emulate --job DIR [--sandbox SPEC] [--devices P] [--steps N] [--no-pruning] [--prefetch-mb N] [--force]
        ->  DIR/emulation/{events,iterations,memory,figures,delays}.parquet, logs/rank=R.log, summary.txt, meta.json
    prism emulate --job DIR --launched OUT [--force]   (OUT: an emulation launched by hand, e.g. over hosts)

``--what-if-args 'ARGS'`` appends ARGS to the program of the sandbox ranks (a changed program whose
communication is the capture's). SPEC: ranks (``3,17``) or coordinates (``pp=last,tp=0,dp=0``; several separated by ``;``), default one rank
of the last pipeline stage (`prism.emulate.sandbox`). The program and its arguments are the capture's
(``raw/meta.json``). The stage checks the job (captured with payloads, graph, calibrated, all of one
run), runs ``prism launch --mode emulate`` into a staging folder, builds the tables
(`prism.emulate.outputs`) and publishes ``DIR/emulation/`` in one rename. Bad input is one message and
exit 2; a sandbox whose communication departs from the capture, exit 1; nothing is written either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from prism import job as job_files
from prism import artifacts
from prism.calibrate import substitute
from prism.job import GraphTablesError, load_graph
from prism.emulate import inputs, outputs, sandbox
from prism import folder_lock
from prism.runtime import modes

PREFIX = "prism emulate"


class EmulateError(Exception):
    """Bad input: one message, exit 2."""


def launch_command(job: inputs.Job, ranks: list[int], out: Path, devices: int | None, steps: int | None,
                   pruning: bool, prefetch_mb: int | None, pin: bool, what_if: list[str] = (),
                   hang_timeout: float | None = None) -> list[str]:
    """The ``prism launch --mode emulate`` command line (the contract with the runtime)."""
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", str(job.world), "--mode", "emulate",
           "--capture", str(job.dir), "--sandbox", ",".join(map(str, ranks)), "--out", str(out)]
    if devices is not None:
        cmd += ["--devices", str(devices)]
    if not pruning:
        cmd.append("--no-pruning")
    if prefetch_mb is not None:
        cmd += ["--prefetch-mb", str(prefetch_mb)]
    if steps is not None:
        cmd += ["--steps-limit", str(steps)]
    if pin:
        cmd.append("--pin")
    if hang_timeout is not None:
        cmd += ["--hang-timeout", f"{hang_timeout:g}"]
    return cmd + job.program + list(what_if)


def _die_with_parent() -> None:
    """In the launcher's child before exec: SIGTERM when this stage dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so the launcher stops its zygote and ranks and removes its temporaries."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _run(cmd: list[str], log: Path) -> int:
    """Run the launcher in its own session, its output forwarded to the terminal and kept in `log`; on an
    interrupt or SIGTERM, stop it whole; if this process is killed outright, the launcher gets SIGTERM."""
    with open(log, "wb") as keep:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
        try:
            for line in proc.stdout:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
                keep.write(line)
            return proc.wait()
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise


def _publish(staging: Path, final: Path) -> None:
    """Replace `final` by `staging` in renames (the old one, with --force, is removed after)."""
    trash = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, trash)
    os.replace(staging, final)
    shutil.rmtree(trash, ignore_errors=True)


STAGING = ".emulation.tmp-"  # JOB/.emulation.tmp-PID: this stage's staging; .emulation.old-PID: its trash


def _check_job(job_dir: Path) -> None:
    if not job_dir.is_dir():
        raise EmulateError(f"{job_dir}: no such job folder; capture the job first (the pipeline, or prism launch "
                           "--mode capture)")


def emulate(job_dir: Path, spec: str | None, devices: int | None = None, steps: int | None = None,
            pruning: bool = True, prefetch_mb: int | None = None, force: bool = False, pin: bool = True,
            launch=None, what_if: list[str] = (), hang_timeout: float | None = None,
            launched: Path | None = None) -> tuple[outputs.Emulation, str]:
    """Run the stage, holding the job folder's lock; returns the emulation and its summary. `what_if`:
    arguments appended to the capture's program for the sandbox ranks (a changed program; its communication
    must stay the capture's). `launch(cmd, out) -> exit code` replaces the launcher subprocess (tests).
    `launched`: the OUT of an emulation already launched by hand (`prism launch --mode emulate`, e.g. one
    launcher per host): its tables are built from it, nothing is launched."""
    _check_job(job_dir)
    if launched is not None:
        spec, launch = _from_launched(job_dir, launched, spec, devices, steps, pruning, prefetch_mb, what_if)
    try:  # the job folder's lock (every command writing into it takes it), the dead ones' staging swept
        with folder_lock.holding(job_dir, PREFIX):
            return _emulate(job_dir, spec, devices, steps, pruning, prefetch_mb, force, pin, launch, what_if,
                            hang_timeout)
    except folder_lock.FolderBusy as exc:
        raise EmulateError(f"{exc} (two emulations of one job would write one emulation/ and share cores, so "
                           "both timings would be wrong)") from None
    except PermissionError as exc:
        raise EmulateError(f"{job_dir}: cannot lock the job folder ({exc.strerror}); make it writable") from None


def _emulate(job_dir, spec, devices, steps, pruning, prefetch_mb, force, pin, launch, what_if, hang_timeout):
    began = time.monotonic()
    final = job_files.emulation(job_dir)
    if final.exists() and any(final.iterdir()) and not force:
        raise EmulateError(f"{final} exists and is not empty: pass --force to replace it")
    if steps is not None and steps < 1:
        raise EmulateError(f"--steps {steps}: emulate at least one step")
    if devices is not None and devices < 1:
        raise EmulateError(f"--devices {devices}: at least one device slot")
    if hang_timeout is not None and not hang_timeout >= 0:
        raise EmulateError(f"--hang-timeout {hang_timeout:g}: give seconds >= 0 (0 turns the watchdog off)")
    job = inputs.load(job_dir)
    ranks_table = artifacts.read_parquet(job_files.graph_file(job_dir, "ranks"))
    ranks = sandbox.resolve(spec, ranks_table)
    captured_steps = max(ranks_table["iterations"].to_pylist(), default=0)
    if steps is not None and steps > captured_steps:
        raise EmulateError(f"--steps {steps}: the capture has {captured_steps} step(s); give at most "
                           f"{captured_steps}, or leave --steps out to emulate them all")
    n_events = dict(zip(ranks_table["rank"].to_pylist(), ranks_table["n_events"].to_pylist()))
    inputs.check_ranks_captured(job, ranks, n_events)
    graph_job = load_graph(job_dir)
    durations, transfers, source = substitute.calibrated_inputs(job_dir, graph_job)
    graph = artifacts.read_parquet(job_files.graph_file(job_dir, "events")).sort_by(
        [("rank", "ascending"), ("seq", "ascending")])
    calibrated = artifacts.read_parquet(job_files.calibrated(job_dir, "iterations"))

    staging = job_dir / f"{STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    run_dir = staging / "run"
    try:
        cmd = launch_command(job, ranks, run_dir, devices, steps, pruning, prefetch_mb, pin, what_if, hang_timeout)
        staging.mkdir(parents=True)
        launch_log = staging / "launch.log"
        code = launch(cmd, run_dir) if launch is not None else _run(cmd, launch_log)
        if code != 0:
            raise LaunchFailed(code, ranks)
        built = outputs.build(graph_job, graph, run_dir, ranks, durations, transfers, steps,
                              substitute.measured_by_slices(source))
        em = outputs.with_figures(built, calibrated)
        result = job_files.emulation(staging)
        artifacts.write_outputs(result, em.tables, outputs.SCHEMAS, run_id=job.meta["run_id"])
        logs = sorted((run_dir / "logs").glob("rank=*.log"))
        (result / "logs").mkdir()
        for log in logs:
            shutil.copy2(log, result / "logs" / log.name)
        if not logs and launch_log.is_file():  # a launcher that keeps no per-rank logs: its whole output
            shutil.copy2(launch_log, result / "logs" / "launch.log")
        text = outputs.summary(em, job_dir, calibrated, devices, time.monotonic() - began)
        job_files.summary(result).write_text(text)
        shutil.copy2(job_files.meta_path(run_dir), job_files.meta_file(result))  # the launch's stats
        _publish(result, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return em, text


def _from_launched(job_dir: Path, launched: Path, spec, devices, steps, pruning, prefetch_mb, what_if):
    """--launched OUT: the sandbox OUT ran (its `raw/meta.json`), and a launch that copies OUT in."""
    given = [name for name, value in (("--devices", devices), ("--steps", steps), ("--no-pruning", not pruning),
                                      ("--prefetch-mb", prefetch_mb), ("--what-if-args", what_if)) if value]
    if given:
        raise EmulateError(f"--launched {launched}: {', '.join(given)} belong to the launch, which already ran "
                           "(give them to `prism launch --mode emulate`)")
    meta_file = job_files.meta_path(launched)
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        raise EmulateError(f"--launched {launched}: no readable raw/meta.json (not the --out of a finished "
                           "`prism launch --mode emulate`)") from None
    try:
        capture = job_files.find_capture(job_dir)[0].resolve()
    except job_files.JobError as exc:
        raise EmulateError(str(exc)) from None
    if modes.of_run(meta) is not modes.MODES["emulate"] or Path(meta.get("capture_dir", "")).resolve() != capture:
        raise EmulateError(f"--launched {launched}: a {meta.get('mode')!r} run of {meta.get('capture_dir')}, not an "
                           f"emulation of this job's capture ({capture})")
    ran = ",".join(map(str, meta["sandbox"]))
    if spec is not None and spec != ran:
        raise EmulateError(f"--launched {launched} ran the sandbox {ran}, not --sandbox {spec}: leave --sandbox out")

    def launch(_cmd, out: Path) -> int:
        shutil.copytree(launched, out)
        return 0
    return ran, launch


class LaunchFailed(Exception):
    def __init__(self, code: int, ranks: list[int]) -> None:
        super().__init__(f"the emulation failed (prism launch exit code {code}; sandbox ranks "
                         f"{','.join(map(str, ranks))}; their output is above); nothing written")
        self.code = code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism emulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True, help="job folder: capture, graph/, calibrated/")
    parser.add_argument("--sandbox", help="ranks (3,17) or coordinates (pp=last,tp=0,dp=0; ...); default: one "
                                          "rank of the last pipeline stage")
    parser.add_argument("--devices", type=int, help="device slots P for the sandbox ranks")
    parser.add_argument("--steps", type=int, help="emulate only the first N steps")
    parser.add_argument("--no-pruning", action="store_true", help="run collectives among all members")
    parser.add_argument("--prefetch-mb", type=int, help="payload prefetch pool size in MiB (0: off)")
    parser.add_argument("--force", action="store_true", help="replace an existing JOB/emulation")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the sandbox ranks to cores")
    parser.add_argument("--hang-timeout", type=float, metavar="S",
                        help="seconds the sandbox ranks and the replay worker may all wait with no op completing "
                             "before the hang is named (exit 86; default $PRISM_HANG_TIMEOUT or 60; 0: never)")
    parser.add_argument("--what-if-args", default="",
                        help="what-if: arguments appended to the capture's program for the sandbox ranks, e.g. "
                             "'--extra-compute-ms 20 --extra-compute-rank 7' (values and compute may change, the "
                             "communication may not)")
    parser.add_argument("--launched", type=Path, metavar="OUT",
                        help="build the tables from an emulation already launched into OUT (`prism launch --mode "
                             "emulate`, e.g. one launcher per host with --nnodes); nothing is launched")
    args = parser.parse_args(argv)
    try:
        what_if = shlex.split(args.what_if_args)
    except ValueError as exc:
        print(f"{PREFIX}: error: --what-if-args {args.what_if_args!r}: {exc} (quote it as a shell would: "
              "--what-if-args \"--fault 'raise'\")", file=sys.stderr)
        return 2
    previous = signal.signal(signal.SIGTERM, _terminated)  # SLURM, Snakemake: stop the launcher, remove staging
    try:
        _, text = emulate(args.job, args.sandbox, args.devices, args.steps, not args.no_pruning,
                          args.prefetch_mb, args.force, not args.no_pin, what_if=what_if,
                          hang_timeout=args.hang_timeout, launched=args.launched)
    except Terminated:
        print(f"{PREFIX}: stopped by SIGTERM; the launcher and its ranks stopped, nothing written", file=sys.stderr)
        return 128 + signal.SIGTERM
    except (EmulateError, inputs.EmulateInputError, sandbox.SandboxError, GraphTablesError,
            artifacts.ArtifactError) as exc:
        print(f"{PREFIX}: error: {exc}", file=sys.stderr)
        return 2
    except outputs.MismatchError as exc:
        print(f"{PREFIX}: error: {exc}; nothing written", file=sys.stderr)
        return 1
    except LaunchFailed as exc:
        print(f"{PREFIX}: error: {exc}", file=sys.stderr)
        return exc.code if exc.code > 0 else 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(text, end="")
    return 0


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C, through the launcher's stop and the staging's removal."""


def _terminated(signum, frame) -> None:
    raise Terminated()


__all__ = ["EmulateError", "emulate", "launch_command", "main"]
