"""What a process forked by the zygote becomes: a rank of the program (`run_rank`: its torchrun
environment, its core, the interception, the program run as `__main__`, its exit code and traceback), or
the replay server of mode slice / the replay worker of mode emulate (`run_replay`). Both die with the
zygote (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import traceback
from pathlib import Path

from prism import settings
from prism.runtime import modes, oom, unsupported
from prism.runtime.launch.zygote_spec import ZygoteSpec

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def run_rank(spec: ZygoteSpec, rank: int) -> int:
    """In the forked child: become rank `rank` and run the program; returns the exit code."""
    die_with_parent()
    world = spec.nproc
    hosts = spec.hosts or {"nproc": world, "node_rank": 0, "nnodes": 1}  # over hosts: torchrun's per-host view
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank - hosts["node_rank"] * hosts["nproc"]), WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(hosts["nproc"]), GROUP_RANK=str(hosts["node_rank"]), ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world), ROLE_NAME="default", GROUP_WORLD_SIZE=str(hosts["nnodes"]),
        MASTER_ADDR=spec.master_addr, MASTER_PORT=str(spec.master_port),
        TORCHELASTIC_RUN_ID=spec.run_id, **{settings.STATUS_DIR.name: spec.status_dir},
    )
    # the program's lines leave the rank as it prints them: its stdout is a pipe to the zygote, which Python
    # buffers by blocks, so `tail -f logs/capture.log` (and a signal's diagnosis) would see them only at exit
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    import torch

    if spec.pin:
        cores = spec.cores or sorted(os.sched_getaffinity(0))  # the claimed ones (`launch.cores`)
        index = spec.ranks.index(rank) if spec.ranks else rank  # slice: one core per slice rank
        if modes.get(spec.mode).sandbox:  # the sandbox ranks share --devices slots
            index %= spec.devices
        os.sched_setaffinity(0, {cores[index % len(cores)]})
        torch.set_num_threads(1)
    intercepted = settings.MODE.is_set()
    if intercepted:
        from prism.runtime import interception

        interception.start_rank()
    code = 0
    try:
        if spec.module:
            import runpy

            sys.argv = [spec.module] + spec.args
            sys.path.insert(0, os.getcwd())
            # preloaded (its imports stay warm): runpy runs it anew as __main__ and warns if it is imported
            sys.modules.pop(spec.module, None)
            runpy.run_module(spec.module, run_name="__main__", alter_sys=True)
        else:
            import runpy

            script = spec.script
            sys.argv = [script] + spec.args
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        text = traceback.format_exc()
        Path(spec.status_dir, f"rank{rank}.traceback").write_text(text)
        if not unsupported.record(exc, rank, spec.status_dir):  # else the supervisor's one line says it
            sys.stderr.write(text)
        code = oom.EXIT_CODE if oom.record_failure(exc, rank, spec.status_dir) else 1
    if intercepted:
        try:
            interception.finish(code)
        except BaseException:
            text = traceback.format_exc()
            sys.stderr.write(text)
            Path(spec.status_dir, f"rank{rank}.traceback").write_text(text)
            code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def run_replay(spec: ZygoteSpec) -> int:
    """In the forked child: become the mode's replay process (`Mode.replay_role`: the slice's replay server,
    emulate's replay worker)."""
    die_with_parent()
    os.environ.update(MASTER_ADDR=spec.master_addr, MASTER_PORT=str(spec.master_port),
                      WORLD_SIZE=str(spec.nproc), TORCHELASTIC_RUN_ID=spec.run_id)
    os.environ.pop(settings.OUT.name, None)  # the server records nothing
    mode = modes.get(spec.mode)
    if spec.pin:  # keep off the slice ranks' cores where others are free (their timings are measured)
        cores = sorted(os.sched_getaffinity(0))
        if spec.cores:  # the ranks' cores were claimed (`launch.cores`): the others
            free = [c for c in cores if c not in spec.cores]
        else:
            free = cores[spec.devices or len(spec.ranks):] if mode.sandbox else cores[len(spec.ranks):]
        if free:
            os.sched_setaffinity(0, set(free))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per gloo pair of each virtual member
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        code = mode.serve_replay(spec)
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        Path(spec.status_dir, "replay.traceback").write_text(text)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code
