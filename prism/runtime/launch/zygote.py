"""The warm zygote: imports torch once, then forks every rank and supervises them.

Started by `prism launch` as `python -m prism.runtime.launch.zygote SPEC.json` with prism's `sitecustomize` on
PYTHONPATH (so the interception is installed here, before any fork, and in anything a rank spawns), or forked
from a warm template that has already imported torch (`zygote_template`, where PRISM_ZYGOTE_TEMPLATE names one).
Forking from a warm process costs a few MiB per rank instead of ~200 MiB for a fresh interpreter.

Mode `slice`: only the slice's ranks are forked (each with its global RANK), plus one replay server
(`prism.runtime.slice.replay_server`, id `REPLAY` here) that answers for every other rank; the job's store is hosted
here. Once the slice ranks succeeded, the server is told to stop (it must have replayed everything).
Mode `emulate` over hosts (`launch.hosts`): a host's zygote forks the sandbox ranks of its block, host 0's also
the replay worker; the store is host 0's launcher's, and the zygotes watch each other's end (`host_watch`):
another host that failed or went away stops this host's ranks, and host 0 stops its worker only once every
other host's sandbox ranks finished.

Supervision: the first rank to fail (non-zero exit or a signal) gets the others stopped (SIGTERM, then
SIGKILL after a grace period); its number and traceback are printed; the zygote exits non-zero. Ranks die
with the zygote (PR_SET_PDEATHSIG), so a killed launcher leaves no process behind.

Exit code 2 is a usage error by convention (argparse's): a program that checks its arguments in every rank
exits 2 in all of them, and typically only rank 0 says why. So a rank's exit 2 does not stop the others at
once: they get USAGE_GRACE_S to exit by themselves (rank 0 to print its message), and when every rank exited
2 one line says so, with no traceback.

What a forked child runs is in `forked_rank`; how the ranks are forked (one after the other, or for many
ranks from helper processes in parallel, the zygote then a child subreaper) in `rank_fork`; the ranks' output
forwarding in `rank_output`; capture mode's link to the coordinator in `coordinator_link`.
"""

from __future__ import annotations

import gc
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path

from prism import settings
from prism.runtime import memory, modes, oom, unsupported, watchdog
from prism.runtime.launch import forked_rank
from prism.runtime.launch import immortal
from prism.runtime.launch import limits
from prism.runtime.launch import stall
from prism.runtime.capture.coordinator_link import CoordinatorLink
from prism.runtime.launch.rank_fork import ForkError, RankForker
from prism.runtime.launch.rank_output import FileOutput, LineForwarder
from prism.runtime.launch.zygote_spec import ZygoteSpec

GRACE_S = 5.0
REPLAY = -1  # mode slice: the replay server's id among the supervised children
REPLAY_GRACE_S = 10.0  # how long the server may still run once the slice ranks finished
USAGE_EXIT = 2  # a program's "bad arguments" exit code (argparse)
USAGE_GRACE_S = 5.0  # after a rank's usage exit, how long the others may take to exit by themselves
REAP_PERIOD_S = 0.5  # the supervisor looks for exited children at least this often
LIMIT_EXIT = 75  # the machine ran out of a resource (memory) while the job ran (EX_TEMPFAIL)


def warm_imports(compute: bool) -> None:
    """Do the lazy imports (and, with `compute`, the lazy initialisations of a first training step) that
    every training script pays for, once, before forking: the ranks then share those pages."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.optim  # noqa: F401
    import torch._dynamo  # noqa: F401  (the optimizers import it on first step)

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # the optimizer's lazy imports
    if settings.MODE.is_set():
        import pyarrow as pa

        pa.array([0])  # pyarrow imports pandas on its first conversion: ~0.3 s and 40 MiB, once here
    if not compute:
        return
    # one intra-op thread: no OpenMP pool may exist at fork time (ranks run single-threaded here anyway)
    torch.set_num_threads(1)
    emb, lin = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8)
    x = emb(torch.tensor([[1, 2, 3]]))
    h = torch.nn.functional.rms_norm(x, (4,)) if hasattr(torch.nn.functional, "rms_norm") else x
    logits = lin(torch.nn.functional.silu(h) * torch.softmax(h, dim=-1))
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 8), torch.tensor([1, 2, 3]))
    if torch.cuda.is_available():  # NVML's answer (`import_environment`): CUDA stays untouched
        # A backward pass starts autograd's device threads, which count the CUDA devices through the CUDA
        # runtime, and the optimizer's step checks for graph capture on the current accelerator: either
        # initialises the driver here, and every forked rank's first CUDA call then fails
        # ("initialization error"). Where there is CUDA, the ranks pay for those lazy steps themselves.
        return
    loss.backward()
    opt = torch.optim.AdamW(list(emb.parameters()) + list(lin.parameters()))
    opt.step()
    opt.zero_grad()


def _warm_up(module: str, args: list[str]) -> None:
    """A preloaded module may offer `prism_warmup(argv)`: one small single-process step of the program,
    run here so that what a first step initialises lazily is shared by every rank (copy-on-write) instead
    of paid in each (the reference workload: ~15 MiB private per rank without, ~7.5 with). A failure costs
    only that saving."""
    warm = getattr(sys.modules.get(module), "prism_warmup", None)
    if not callable(warm):
        return
    try:
        warm(list(args))
    except Exception as exc:  # noqa: BLE001 - the ranks still run; they pay for their first step themselves
        print(f"[prism] warm-up of {module} failed ({type(exc).__name__}: {exc}); the ranks will run without it",
              file=sys.stderr)


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def launcher_gone(lifeline: int | None) -> bool:
    """Whether the launcher of a zygote forked from a template exited: the lifeline, a pipe's read end whose only
    writer is the launcher, is at its end."""
    return lifeline is not None and bool(select.select([lifeline], [], [], 0)[0])


def supervise(spec: ZygoteSpec, lifeline: int | None = None) -> int:
    """Fork the ranks, wait for them; stop all on the first failure. Returns the exit code. `lifeline`: see
    `launcher_gone`."""
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        stopping["signal"] = signum

    # waitpid(-1) walks every child in the kernel (O(W) a call): it is called when a child changed state
    # (SIGCHLD) and, in case a signal is missed, at least every REAP_PERIOD_S, not after every message
    reap = {"due": True, "at": 0.0}

    def on_child(_signum, _frame):
        reap["due"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGCHLD, on_child)
    forks_began = time.monotonic()
    _raise_fd_limit(limits.fds_needed(spec.nproc, spec.mode, spec.rank_output))
    sys.stdout.flush()
    sys.stderr.flush()
    out = LineForwarder()
    # the ranks' output in files (capture beyond the open-file limit's pipes: `limits.rank_output`), else pipes
    files = FileOutput(str(Path(spec.status_dir, "output"))) if spec.rank_output == "files" else None
    mode = modes.get(spec.mode)
    capture = mode.coordinator
    slice_mode = mode.replay  # slice or emulate: only some ranks, plus the replay process

    def run(rank: int) -> int:  # in the forked child
        return forked_rank.run_replay(spec) if rank == REPLAY else forked_rank.run_rank(spec, rank)

    ids = _replay_ids(spec) if slice_mode else list(_local_ranks(spec))
    forker = RankForker(spec, ids, capture, out, files, run, unlogged=(REPLAY,))
    try:
        forker.fork_all()
    except ForkError as exc:
        print(f"[prism] {exc}", file=sys.stderr, flush=True)
        return LIMIT_EXIT
    children, ctl = forker.children, forker.ctl
    spec.pids = {rank: pid for pid, rank in children.items()}
    stall.write_pids(spec.status_dir, children)  # the launcher's progress watchdog names them (`stall`)
    spec.fork_s = round(time.monotonic() - forks_began, 3)  # the fork loop (the ranks wait for it to end)
    spec.fork_helpers = forker.helpers
    # the threads made from here on (the store's, the coordinator's unlinker) keep SIGCHLD blocked: it is
    # the main thread's, and no system call of theirs is interrupted by one of W exits
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    link = CoordinatorLink(spec, ctl, out) if capture else None
    progress = progress_state = None
    if spec.progress:
        from prism.runtime.launch.progress import CaptureProgress, IterationProgress

        tty = spec.progress == "tty"
        if link is not None:
            progress, progress_state = CaptureProgress(sys.stderr, tty), link.coord
        else:  # real, slice, emulate: iterations the real ranks ended, from their notes in the status folder
            real = [r for r in ids if r != REPLAY] if slice_mode else list(range(spec.nproc))
            progress = IterationProgress(sys.stderr, tty, spec.mode, real, spec.iterations)
            progress_state = Path(spec.status_dir)
        out.before_write = progress.clear
    store = watch = None
    if slice_mode and spec.hosts is None:  # the job's store: the ranks' rendezvous and every group's gloo
        import torch.distributed as dist  # rendezvous (over hosts: host 0's launcher serves it)

        store = dist.TCPStore(spec.master_addr, spec.master_port, spec.nproc, is_master=True,
                              wait_for_workers=False)
    if slice_mode and spec.hosts is not None:  # an emulation over hosts: the hosts watch each other's end
        from prism.runtime.launch.host_watch import HostWatch

        watch = HostWatch(spec.hosts, spec.host_records)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    replay = {"pid": spec.pids.get(REPLAY), "stopped": False, "wait_until": None, "error": None}
    failed: tuple[int, int] | None = None  # (rank, code)
    exited_ok: list[int] = []  # ranks that returned 0 while others still ran, before any failure
    usage_exits = 0
    usage_until = None  # a rank exited with USAGE_EXIT: the others are stopped only after this
    deadline = None
    hang = Path(spec.status_dir, watchdog.REPORT)  # real mode: a rank's watchdog found every rank stuck
    watched = mode.watchdog  # the ranks' watchdog (slice: the slice ranks')
    memory_watch = limits.MemoryWatch(len(ids)) if capture else None
    limit_error = None
    while children:
        if memory_watch is not None and deadline is None and limit_error is None:
            limit_error = memory_watch.check(time.monotonic())
            if limit_error:
                out.before_write()
                print(f"[prism] capture stopped: {limit_error}", file=sys.stderr, flush=True)
                deadline = _stop(children, time.monotonic())
        if watched and deadline is None and hang.exists():
            deadline = _stop(children, time.monotonic())
        if usage_until is not None and deadline is None and time.monotonic() > usage_until:
            deadline = _stop(children, time.monotonic())
        if watch is not None and deadline is None and failed is None and watch.poll():
            out.before_write()
            print(f"[prism] emulation stopped: {watch.error}", file=sys.stderr, flush=True)
            deadline = _stop(children, time.monotonic())
        if slice_mode and deadline is None and failed is None and set(children.values()) == {REPLAY} \
                and (watch is None or watch.others_done()):
            deadline = _stop_replay(spec, replay, children)
        if link is not None:
            link.poll()
        if link is not None and link.error and deadline is None:
            out.before_write()
            print(f"[prism] capture stopped: {link.error}", file=sys.stderr, flush=True)
            deadline = _stop(children, time.monotonic())
        if launcher_gone(lifeline):  # forked from a template (`zygote_template`): its launcher died
            os.kill(os.getpid(), signal.SIGKILL)  # (what PR_SET_PDEATHSIG does to a zygote the launcher started)
        if stopping["signal"] is not None and deadline is None:
            out.before_write()
            print(f"[prism] launcher got signal {stopping['signal']}: stopping {len(children)} ranks",
                  file=sys.stderr)
            deadline = _stop(children, time.monotonic())
        out.pump(0.01)
        if progress is not None:
            progress.maybe_show(progress_state)
        now = time.monotonic()
        due = reap["due"] or now - reap["at"] >= REAP_PERIOD_S
        if due:
            reap["due"], reap["at"] = False, now
        while children and due:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            rank = children.pop(pid, None)
            if rank is None:  # an orphan of a rank's own child, re-parented to this subreaper (`rank_fork`)
                continue
            if files is not None:
                files.forward(rank, out.before_write, sys.stdout.buffer, sys.stderr.buffer)
            code = os.waitstatus_to_exitcode(status)
            usage_exits += code == USAGE_EXIT
            if code == 0 and failed is None and deadline is None and rank != REPLAY and children:
                exited_ok.append(rank)
            if code != 0 and failed is None and deadline is None:
                failed = (rank, code)
                if code == USAGE_EXIT:
                    usage_until = time.monotonic() + USAGE_GRACE_S
                else:
                    deadline = _stop(children, time.monotonic())
        if deadline is not None and time.monotonic() > deadline:
            for p in children:
                _kill(p, signal.SIGKILL)
            deadline = float("inf")
    if progress is not None:
        progress.clear()
    out.drain(2.0)
    if files is not None:  # ranks stopped before they were reaped one by one (there are none otherwise)
        files.forward_rest(out.before_write, sys.stdout.buffer, sys.stderr.buffer)
    del store
    if watch is not None:
        host_error = watch.error or (watch.settle(3.0) if failed is not None or replay["error"] else None)
        watch.close(None if host_error else _failure_reason(failed, replay, stopping, mode))
        if host_error:
            if failed is not None or replay["error"]:  # this host's ranks failed because of it: say so once
                print(f"[prism] emulation stopped: {host_error}", file=sys.stderr, flush=True)
            return 1
    if limit_error:
        if link is not None:
            link.close(limit_error)
        return LIMIT_EXIT
    early = _early_exits(exited_ok)
    if replay["error"]:
        print(f"[prism] {mode.name} run failed: {replay['error']}{early}", file=sys.stderr)
        return 3
    if link is not None:
        link.close()
        if link.error:  # a hang or a mismatch (86); over hosts, another host that failed (1)
            return link.error_code()
    if hang.exists():
        print(f"[prism] run stopped: {hang.read_text()}", file=sys.stderr)
        return watchdog.HANG_EXIT_CODE
    if failed is not None and failed[1] == USAGE_EXIT and usage_exits == len(ids):
        print(f"[prism] every rank exited with code {USAGE_EXIT}: the program rejected its arguments "
              "(its message is above)", file=sys.stderr)
        return USAGE_EXIT
    # a rank's out-of-memory record makes the run a finding whichever rank's exit came first (a peer of the
    # rank that ran out can fail sooner, e.g. its gloo connection closed while that rank was finishing)
    if failed is not None and (finding := oom.finding(spec.status_dir)):
        print(f"[prism] {finding} The other ranks were stopped.", file=sys.stderr)
        return oom.EXIT_CODE
    if failed is not None and (finding := unsupported.finding(spec.status_dir, failed[0])):
        print(f"[prism] {finding}. The other ranks were stopped.", file=sys.stderr)
        return unsupported.EXIT_CODE
    if failed is not None:
        rank, code = failed
        how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
        who = mode.replay_name if rank == REPLAY else f"rank {rank}"
        print(f"[prism] {who} failed with {how}; the other ranks were stopped.{early}", file=sys.stderr)
        tb = Path(spec.status_dir, "replay.traceback" if rank == REPLAY else f"rank{rank}.traceback")
        if tb.exists():
            print(f"[prism] {who} traceback:\n{tb.read_text()}", file=sys.stderr, end="")
        return code if code > 0 else 128 - code
    if stopping["signal"] is not None:
        return 128 + stopping["signal"]
    return 0


def _replay_ids(spec: ZygoteSpec) -> list[int]:
    """Slice and emulate: the ranks run for real, and the replay process. Over hosts (emulate): this host's
    sandbox ranks (of its block, `launch.hosts`), and the one replay worker on host 0."""
    hosts = spec.hosts
    if not hosts:
        return list(spec.ranks) + [REPLAY]
    mine = [r for r in spec.ranks if r // hosts["nproc"] == hosts["node_rank"]]
    return mine + ([REPLAY] if hosts["node_rank"] == 0 else [])


def _failure_reason(failed, replay: dict, stopping: dict, mode) -> str | None:
    """Why this host's run ended without success, for the other hosts (None: it succeeded)."""
    if replay["error"]:
        return f"the {mode.replay_name} failed"
    if failed is not None:
        rank, code = failed
        return f"{mode.replay_name if rank == REPLAY else f'rank {rank}'} failed (exit code {code})"
    if stopping["signal"] is not None:
        return f"its launcher got signal {stopping['signal']}"
    return None


def _local_ranks(spec: ZygoteSpec) -> range:
    """The global ranks this zygote forks: all, or over hosts this host's block (`launch.hosts`)."""
    hosts = spec.hosts
    if hosts:
        return range(hosts["node_rank"] * hosts["nproc"], (hosts["node_rank"] + 1) * hosts["nproc"])
    return range(spec.nproc)


def _early_exits(ranks: list[int]) -> str:
    """The ranks that returned (code 0) while their peers still ran, in capture's words: a peer still waiting
    on one of them fails with a closed connection, which is the consequence, not the cause."""
    if not ranks:
        return ""
    shown = ", ".join(f"rank {r} has exited (code 0)" for r in ranks[:8]) + (" ..." if len(ranks) > 8 else "")
    return (f" Before that, {shown} while the others still ran: a rank that ends before its peers leaves "
            "them waiting on it (gloo then reports the connection closed by peer)")


def _stop_replay(spec: ZygoteSpec, replay: dict, children: dict[int, int]) -> float | None:
    """The slice ranks all succeeded: stop the replay server once it replayed everything (returns a stop
    deadline when it did not in time: the program issued fewer operations than in the capture)."""
    if replay["stopped"]:
        return None
    now = time.monotonic()
    if Path(spec.status_dir, "replay.done").exists():
        replay["stopped"] = True
        _kill(replay["pid"], signal.SIGTERM)
        return None
    if replay["wait_until"] is None:
        replay["wait_until"] = now + REPLAY_GRACE_S
        return None
    if now < replay["wait_until"]:
        return None
    replay["error"] = ("the slice ranks finished, but the replay server had not replayed every operation of "
                       "the capture (see its message above): the program issued fewer operations than in the "
                       "capture (another program or arguments, or a nondeterministic program)")
    replay["stopped"] = True
    return _stop(children, now)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stop(children: dict[int, int], now: float) -> float:
    for pid in children:
        _kill(pid, signal.SIGTERM)
    return now + GRACE_S


def import_environment(env, pin: bool) -> dict[str, str]:
    """The environment the zygote imports torch with: `env` (the launcher's), plus what `main` sets first. CUDA:
    the zygote never initialises it (the ranks do, after the fork), and `torch.cuda.is_available()` asks the
    CUDA runtime (which marks any later fork bad) unless NVML answers it: NVML answers here and in the ranks
    (the answer is the same). Pinned: one OpenMP thread."""
    env = dict(env)
    env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if pin:
        env["OMP_NUM_THREADS"] = "1"
    return env


def _check_cuda_uninitialised(spec: ZygoteSpec) -> None:
    import torch

    if torch.cuda.is_initialized():
        by = f" (by --preload {','.join(spec.preload)}?)" if spec.preload else ""
        raise SystemExit(f"[prism] CUDA was initialised in prism's zygote before the ranks were forked{by}: "
                         "forked ranks could not use CUDA. Preload only modules that do not touch CUDA at "
                         "import time.")


def main(lifeline: int | None = None) -> int:
    """The zygote of one launch (`python -m prism.runtime.launch.zygote SPEC`, or `zygote_template.become_zygote`
    in a fork of the template, with the launcher's `lifeline`)."""
    began = time.monotonic()
    spec = ZygoteSpec.read(Path(sys.argv[1]))
    mode = modes.get(spec.mode)
    forked_rank.die_with_parent()
    stall.enable_dumps()  # it and the ranks it forks dump their stacks on the progress watchdog's signal
    os.environ.update(import_environment(os.environ, spec.pin))
    warm_imports(compute=mode.coordinator or bool(spec.pin))
    if spec.preload:
        import importlib

        sys.path.insert(0, os.getcwd())
        for name in spec.preload:
            importlib.import_module(name)
        sys.path.pop(0)
        for name in spec.preload:
            _warm_up(name, spec.args or [])
    _check_cuda_uninitialised(spec)
    # Move everything imported so far out of the garbage collector's reach: otherwise each rank's first
    # collections touch (and so copy) every page of the zygote's heap. In capture mode (thousands of ranks)
    # the objects also become immortal first (CPython 3.12+): the ranks then stop writing their reference
    # counts, and the pages those sit on stay shared; the C heap's free pages go back to the kernel
    gc.collect()
    if mode.coordinator:  # thousands of ranks share the zygote's pages
        spec.immortal = immortal.immortalise()
        memory.trim()
        # and the C heap's free chunks are taken here: a rank's allocations would otherwise land in them, each
        # copying the zygote's page it lands on (2.3 MiB a rank, docs/benchmarks.md "Session 11")
        spec.heap_holes = (memory.fill_heap_holes() or {"skipped": "no glibc mallinfo2"}) \
            if settings.HEAP_HOLES.get() else {"skipped": f"{settings.HEAP_HOLES.name}=0"}
    gc.freeze()
    spec.warm_s = round(time.monotonic() - began, 3)  # imports, preloads, warm-up, immortalising: before the forks
    return supervise(spec, lifeline)


if __name__ == "__main__":
    sys.exit(main())
