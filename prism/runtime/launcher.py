"""`prism launch`: a torchrun-compatible launcher that runs W ranks forked from a warm zygote.

    prism launch --nproc W [--mode real|capture|off] [--out DIR] [--pin] (SCRIPT | -m MODULE) [ARGS...]
    prism launch --nproc W --mode slice --slice-ranks 0,1 --capture CAPDIR [--out DIR] [--pin] ...

Mode `slice` forks only the slice's ranks (global RANK, WORLD_SIZE=W) plus a replay server that answers
for every other rank from the capture in CAPDIR (`prism launch --mode capture --out CAPDIR`).

Everything a user can get wrong is checked here, before any rank starts (exit code 2). With `--out`, the
ranks' PrismTrace goes to a staging folder that becomes `DIR/raw` only when every rank succeeded, so a
failed run leaves no partial artifact.

Exit codes: 0 every rank succeeded; 2 bad input; 86 the job hangs (capture: no rank can run, or the members
of a collective disagree; real: no op completed on any rank for --hang-timeout seconds) and the message
says which ranks wait where; otherwise the exit code of the first rank that failed.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from dataclasses import dataclass, field
from pathlib import Path

from prism.runtime import watchdog

SITE_DIR = Path(__file__).parent / "site"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
MODES = ("real", "capture", "slice", "off")
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
SLICE_LAZY_GLOO_FROM = 64  # slice mode: above this W, gloo connects lazily (TORCH_GLOO_LAZY_INIT)


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
    master_port: int = 0
    devices: int | None = None  # capture: device slots P (None: every core)
    payloads: bool = True  # capture: keep every contribution for the later modes
    preload: list[str] = field(default_factory=list)  # modules imported once in the zygote
    slice_ranks: list[int] = field(default_factory=list)  # slice: the ranks that run for real
    capture: Path | None = None  # slice: the capture folder the replay server answers from
    hang_timeout: float | None = None  # real: seconds without a completed op before a hang is named


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
                   "--slice-ranks", "--capture", "--hang-timeout"):
            i += 2
            continue
        if not tok.startswith("-"):
            split = i
            break
        i += 1
    parser = argparse.ArgumentParser(prog="prism launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", "--nproc-per-node", type=int, required=True, help="number of ranks W")
    parser.add_argument("--mode", default="real", choices=MODES,
                        help="real: record PrismTrace over the real backend; capture: run W ranks on "
                             "--devices slots through the coordinator; slice: run --slice-ranks for real, "
                             "the other ranks replayed from --capture; off: no interception")
    parser.add_argument("--slice-ranks", default="", help="slice: comma-separated global ranks to run for real")
    parser.add_argument("--capture", type=Path, default=None,
                        help="slice: the capture folder (raw/ and payloads/) that the replay server answers from")
    parser.add_argument("--devices", type=int, default=None,
                        help="capture: device slots P (CPU: cores; default all cores)")
    parser.add_argument("--preload", default="",
                        help="comma-separated modules to import once in the zygote before forking (modules "
                             "without import side effects; saves their import in every rank)")
    parser.add_argument("--no-payloads", action="store_true",
                        help="capture: do not keep payloads (only the graph is needed)")
    parser.add_argument("--out", type=Path, help="job folder: the trace goes to OUT/raw")
    parser.add_argument("--pin", action="store_true", help="pin rank i to core i mod cores, 1 thread")
    parser.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one)")
    parser.add_argument("--hang-timeout", type=float, default=None, metavar="S",
                        help=f"real: when no op completed on any rank for S seconds, name the hang and stop "
                             f"(exit {watchdog.HANG_EXIT_CODE}; default ${watchdog.ENV} or "
                             f"{watchdog.DEFAULT_TIMEOUT_S:g}; 0: never)")
    if split is None:
        parser.parse_args(argv)
        raise LaunchError("no program given: add SCRIPT or -m MODULE after the options "
                          "(e.g. prism launch --nproc 2 -m prism.workloads.moe_gpt)")
    opts = parser.parse_args(argv[:split])
    rest = argv[split:]
    spec = LaunchSpec(nproc=opts.nproc, mode=opts.mode, out=opts.out, pin=opts.pin,
                      master_port=opts.master_port, devices=opts.devices, payloads=not opts.no_payloads,
                      preload=[m for m in opts.preload.split(",") if m], capture=opts.capture,
                      hang_timeout=opts.hang_timeout)
    try:
        spec.slice_ranks = [int(r) for r in opts.slice_ranks.split(",") if r.strip()]
    except ValueError:
        raise LaunchError(f"--slice-ranks must be comma-separated rank numbers (got {opts.slice_ranks!r})") from None
    if rest[0] in ("-m", "--module"):
        if len(rest) < 2:
            raise LaunchError("-m needs a module name (e.g. -m prism.workloads.moe_gpt)")
        spec.module, spec.args = rest[1], rest[2:]
    else:
        spec.script, spec.args = rest[0], rest[1:]
    return spec


def validate(spec: LaunchSpec) -> None:
    """Raise LaunchError naming the cause and the fix."""
    if spec.nproc < 1:
        raise LaunchError(f"--nproc must be at least 1 (got {spec.nproc})")
    if spec.hang_timeout is not None and not spec.hang_timeout >= 0:
        raise LaunchError(f"--hang-timeout {spec.hang_timeout:g}: give seconds >= 0 (0 turns the watchdog off)")
    if spec.hang_timeout is not None and spec.mode != "real":
        raise LaunchError(f"--hang-timeout belongs to --mode real (--mode {spec.mode} "
                          + ("names a hang by itself)" if spec.mode == "capture" else "has no watchdog)"))
    try:
        watchdog.timeout_from_env()
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if spec.mode == "capture":
        cores = len(os.sched_getaffinity(0))
        if spec.nproc < 2:
            raise LaunchError("capture needs at least 2 ranks (--nproc 1 has nothing to capture: "
                              "run it with --mode real)")
        if spec.devices is None:
            spec.devices = min(cores, spec.nproc)
        if spec.devices < 1 or spec.devices > cores:
            raise LaunchError(f"--devices {spec.devices} is not possible here: this machine has {cores} "
                              f"cores (CPU device slots); use 1..{cores}")
    if spec.mode == "slice":
        _validate_slice(spec)
    elif spec.slice_ranks or spec.capture is not None:
        raise LaunchError("--slice-ranks and --capture belong to --mode slice")
    if spec.script is not None:
        if not Path(spec.script).is_file():
            raise LaunchError(f"script not found: {spec.script} (check the path, or use -m MODULE)")
    elif _find_module(spec.module) is None:
        raise LaunchError(f"module not found: {spec.module} (is it installed, or in the current "
                          f"folder {os.getcwd()}?)")
    if spec.out is not None:
        try:
            spec.out.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=spec.out, prefix=".prism-write-test-")
            probe.close()
        except OSError as exc:
            raise LaunchError(f"--out {spec.out} is not writable ({exc.strerror}); choose another folder")
    for name in spec.preload:
        if _find_module(name) is None:
            raise LaunchError(f"--preload: module not found: {name}")
    _check_known_workload(spec)


def _validate_slice(spec: LaunchSpec) -> None:
    ranks, world = spec.slice_ranks, spec.nproc
    if not ranks:
        raise LaunchError("--mode slice needs --slice-ranks (e.g. --slice-ranks 0,1: the ranks that run for real)")
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise LaunchError(f"--slice-ranks {bad} outside 0..{world - 1} (--nproc {world})")
    if len(set(ranks)) != len(ranks):
        raise LaunchError(f"--slice-ranks lists a rank twice: {ranks}")
    cores = len(os.sched_getaffinity(0))
    if len(ranks) > cores:
        raise LaunchError(f"a slice of {len(ranks)} ranks needs {len(ranks)} cores (one device each); this "
                          f"machine has {cores}: plan slices of at most {cores} ranks")
    if spec.capture is None:
        raise LaunchError("--mode slice needs --capture CAPDIR (the output folder of `prism launch --mode capture`)")
    meta_path = spec.capture / "raw" / "meta.json"
    if not meta_path.is_file():
        raise LaunchError(f"--capture {spec.capture}: no raw/meta.json (not a capture folder, or the capture "
                          "did not finish); run `prism launch --mode capture --out CAPDIR` first")
    meta = json.loads(meta_path.read_text())
    if meta.get("mode") != "capture":
        raise LaunchError(f"--capture {spec.capture}: a {meta.get('mode')!r} run, not a capture")
    if meta.get("world_size") != world:
        raise LaunchError(f"--capture {spec.capture} has {meta.get('world_size')} ranks, --nproc is {world}: "
                          "a slice runs the captured job at its own size")
    if not meta.get("payloads", False) or not (spec.capture / "payloads").is_dir():
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


def _check_known_workload(spec: LaunchSpec) -> None:
    """The reference workload's layout is checked before any rank starts."""
    if spec.module != "prism.workloads.moe_gpt":
        return
    from prism.workloads import moe_gpt

    try:
        args = moe_gpt.parse_args(spec.args)
    except SystemExit:  # argparse already printed what is wrong with the flags
        raise LaunchError(f"invalid arguments for {spec.module} (see above)") from None
    problem = moe_gpt.layout_error(args, spec.nproc)
    if problem:
        raise LaunchError(f"{spec.module}: {problem}")
    if spec.module not in spec.preload:  # it has no import side effects: every rank may share it
        spec.preload.append(spec.module)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec: LaunchSpec) -> int:
    """Run the job; returns the exit code (0: every rank succeeded)."""
    validate(spec)
    run_id = uuid.uuid4().hex[:12]
    status_dir = Path(tempfile.mkdtemp(prefix=f"prism-{run_id}-"))
    staging = None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SITE_DIR), str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    for var in ("PRISM_MODE", "PRISM_OUT", "PRISM_PAYLOADS", "PRISM_SHM_DIR", "PRISM_CORES", "PRISM_CAPTURE",
                "PRISM_SLICE_RANKS"):
        env.pop(var, None)
    payload_staging = shm_dir = None
    if spec.hang_timeout is not None:
        env[watchdog.ENV] = str(spec.hang_timeout)
    if spec.mode != "off":
        env["PRISM_MODE"] = spec.mode
        if spec.out is not None:
            staging = spec.out / f".raw.tmp-{run_id}"
            staging.mkdir(parents=True)
            env["PRISM_OUT"] = str(staging.resolve())
    if spec.mode == "capture":
        shm_dir = Path(SHM_ROOT) / f"prism-{run_id}"
        shm_dir.mkdir(parents=True)
        env.update(PRISM_SHM_DIR=str(shm_dir), TORCHELASTIC_USE_AGENT_STORE="True", TORCH_DIST_INIT_BARRIER="0",
                   PRISM_CORES=",".join(map(str, sorted(os.sched_getaffinity(0)))))
        if spec.out is not None and spec.payloads:
            payload_staging = spec.out / f".payloads.tmp-{run_id}"
            payload_staging.mkdir(parents=True)
            env["PRISM_PAYLOADS"] = str(payload_staging.resolve())
    if spec.mode == "slice":  # the store is hosted by the supervisor, as in capture
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCH_DIST_INIT_BARRIER="0", PRISM_CAPTURE=str(spec.capture),
                   PRISM_SLICE_RANKS=",".join(map(str, spec.slice_ranks)))
        if spec.nproc > SLICE_LAZY_GLOO_FROM and "TORCH_GLOO_LAZY_INIT" not in env:
            # a group of W members costs the replay server ~W^2 connections when made eagerly; lazily, only
            # the pairs that ever talk connect (on their first op; set TORCH_GLOO_LAZY_INIT=0 to keep eager)
            env["TORCH_GLOO_LAZY_INIT"] = "1"
    zspec = {
        "nproc": spec.nproc, "script": spec.script, "module": spec.module, "args": spec.args,
        "pin": spec.pin, "master_addr": "127.0.0.1", "master_port": spec.master_port or free_port(),
        "run_id": run_id, "status_dir": str(status_dir), "mode": spec.mode, "devices": spec.devices,
        "shm_dir": str(shm_dir) if shm_dir else None, "preload": spec.preload,
    }
    if spec.mode == "slice":
        zspec.update(ranks=spec.slice_ranks, capture=str(spec.capture))
    spec_file = status_dir / "spec.json"
    spec_file.write_text(json.dumps(zspec))
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "prism.runtime.zygote", str(spec_file)], env=env)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if shm_dir is not None:
            shutil.rmtree(shm_dir, ignore_errors=True)
    if code < 0:  # the zygote died of a signal: report it as a shell would
        code = 128 - code
    stats_file = status_dir / ("replay.done" if spec.mode == "slice" else "capture_stats.json")
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
    shutil.rmtree(status_dir, ignore_errors=True)
    if code == 0 and staging is not None:
        _publish(staging, spec, run_id, started, stats)
        if payload_staging is not None:
            _replace_dir(payload_staging, spec.out / "payloads", run_id)
    else:
        for folder in (staging, payload_staging):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return code


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
    return {
        "switch_cost_us": sum(r["switch_ns"] for r in rows) / switches / 1e3 if switches else None,
        "rank_blocks": sum(r["blocks"] for r in rows),
        "logical_s_min": logical[0] / 1e9, "logical_s_median": logical[len(logical) // 2] / 1e9,
        "logical_s_max": logical[-1] / 1e9,
    }


def _publish(staging: Path, spec: LaunchSpec, run_id: str, started: float, stats: dict) -> None:
    from importlib.metadata import version

    meta = {
        "world_size": spec.nproc, "mode": spec.mode, "hostname": socket.gethostname(),
        "command": (["-m", spec.module] if spec.module else [spec.script]) + spec.args,
        "pin": spec.pin, "cores": len(os.sched_getaffinity(0)), "run_id": run_id, "started": started, "wall_s": time.time() - started,
        "torch_version": version("torch"), "schema_version": "1",
    }
    if spec.mode == "capture":
        meta.update(devices=spec.devices, payloads=spec.payloads, capture={**stats, **_rank_stats(staging)})
    if spec.mode == "slice":
        meta.update(slice_ranks=spec.slice_ranks, capture_dir=str(spec.capture), replay=stats,
                    gloo_lazy_init=os.environ.get("TORCH_GLOO_LAZY_INIT",
                                                  "1" if spec.nproc > SLICE_LAZY_GLOO_FROM else "0") == "1")
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    _replace_dir(staging, spec.out / "raw", run_id)


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
