"""Substitutes prism's backend for every process group a program creates, without touching its code.

`install(mode, out_dir)` registers the `prism` backend and wraps
`torch.distributed.distributed_c10d._new_process_group_helper`, through which `init_process_group`,
`new_group` and DeviceMesh all create their groups: whatever backend the program asked for ("gloo",
"nccl", "cpu:gloo,cuda:nccl", none), the group is made by prism's creator, which remembers what was asked
for so that the `real` transport can use it. The rank's `Recorder` and the global markers come with it.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from prism.runtime import markers, modes, oom, unsupported, watchdog
from prism.runtime.capture import client as capture
from prism.runtime.capture import nonmember_groups
from prism.runtime.launch import progress
from prism.runtime.backend import PrismProcessGroup
from prism.runtime.capture.transport import CaptureTransport
from prism.runtime.recorder import Recorder
from prism.runtime.slice.transport import SliceRecorder, SliceTransport
from prism.runtime.transport import RealTransport, job_store, slice_store

MODES = tuple(name for name, m in modes.MODES.items() if m.intercepted)

_state: dict = {"installed": False, "recorder": None, "hooks": None, "asked": [], "mode": None, "out": None}


def recorder() -> Recorder | None:
    return _state["recorder"]


def _ensure_recorder() -> Recorder | None:
    if _state["hooks"] is None:
        rec = None
        if _state["out"] is not None:
            rank = int(os.environ.get("RANK", "0"))
            device = "cuda" if torch.cuda.is_available() and os.environ.get("PRISM_DEVICE", "cpu") == "cuda" else "cpu"
            if modes.get(_state["mode"]).recorder == "checked":  # checks every op against the capture as issued
                rec = SliceRecorder(rank, _state["out"], Path(os.environ["PRISM_CAPTURE"]), device=device)
            else:
                rec = Recorder(rank, _state["out"], device=device)
        _state["recorder"] = rec
        drain = _drain if modes.get(_state["mode"]).coordinator else None
        wanted = rec or drain or os.environ.get(progress.ENV)  # progress: iteration ends even with nothing recorded
        _state["hooks"] = markers.install(rec, on_boundary=drain) if wanted else []
    return _state["recorder"]


def _captured_results():
    """Slice mode: the capture's results of this rank's order-dependent reductions (one per rank)."""
    from prism.runtime.slice.transport import CapturedResults

    if _state.get("results") is None:
        _state["results"] = CapturedResults(Path(os.environ["PRISM_CAPTURE"]), int(os.environ.get("RANK", "0")))
    return _state["results"]


def _drain() -> None:
    """A capture drain point: complete pending ops; the parked time is no one's compute."""
    if capture.client().drain() and _state["recorder"] is not None:
        _state["recorder"].resync()


def _create(dist_opts, backend_options) -> PrismProcessGroup:
    asked, desc = _state["asked"][-1] if _state["asked"] else ("gloo", None)
    members = list(dist_opts.global_ranks_in_group) or list(range(dist_opts.group_size))
    name = str(dist_opts.group_id)
    rec = _ensure_recorder()
    kind = modes.get(_state["mode"]).transport
    if kind == "capture":
        transport = CaptureTransport(name, dist_opts.group_rank, members, desc)
    elif kind == "emulate":
        from prism.runtime.emulate.transport import EmulateTransport

        _common_start(dist_opts.store, rec)
        transport = EmulateTransport(dist_opts.store, name, dist_opts.group_rank, members, dist_opts.timeout)
    else:
        args = (dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout)
        kwargs = dict(want_nccl="nccl" in asked or asked == "undefined", global_ranks=members, group_name=name)
        if kind == "slice":
            # the real transport, in a key space the replay server (the virtual members) can reach
            transport = SliceTransport(slice_store(name, dist_opts.store), *args, results=_captured_results(),
                                       **kwargs)
            slice_ranks = [int(r) for r in os.environ.get("PRISM_SLICE_RANKS", "").split(",") if r]
            watchdog.start(job_store(dist_opts.store), int(os.environ.get("RANK", "0")),
                           int(os.environ.get("WORLD_SIZE", "1")), ranks=slice_ranks or None)
        else:
            transport = RealTransport(dist_opts.store, *args, **kwargs)
            watchdog.start(job_store(dist_opts.store), int(os.environ.get("RANK", "0")),
                           int(os.environ.get("WORLD_SIZE", "1")))
    if rec is not None:
        rec.add_group(name, desc, members, asked)
    real = "nccl" if "nccl" in asked and torch.cuda.is_available() else "gloo"
    pg = PrismProcessGroup(dist_opts.group_rank, dist_opts.group_size, members, name, desc, transport, rec,
                           backend_name=real)
    pg.computes = kind != "real"  # prism computes the collectives: only what its semantics define
    return pg


def _common_start(store, rec: Recorder | None) -> None:
    """Emulate, at the rank's first group: meet the other sandbox ranks and the replay worker; the rank's
    timeline starts at their common t0 (`timed_replay.common_start`)."""
    if _state.get("t0_ns") is None:
        from prism.runtime.emulate.transport import sandbox_ranks
        from prism.runtime.emulate.common_start import common_start

        _state["t0_ns"] = common_start(job_store(store), len(sandbox_ranks()) + 1)
        if rec is not None:
            rec.resync(_state["t0_ns"])


def install(mode: str, out_dir: str | Path | None) -> None:
    """Route every process group through prism's backend in `mode`, recording to `out_dir` (or not)."""
    if mode not in MODES:
        raise ValueError(f"PRISM_MODE={mode!r} is not a mode of this prism (modes: {', '.join(MODES)})")
    mode_ = modes.get(mode)
    if _state["installed"]:
        return
    _state.update(installed=True, mode=mode, out=Path(out_dir) if out_dir else None)
    dist.Backend.register_backend("prism", _create, extended_api=True, devices=["cpu", "cuda"])
    if mode_.coordinator:
        capture.install_future_helpers()
        nonmember_groups.install()  # a rank outside a new group: answered without torch's per-call work
    original = c10d._new_process_group_helper

    def helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs):
        desc = kwargs.get("group_desc")
        if desc is None and len(args) >= 5:
            desc = args[4]
        asked = str(backend).lower()
        if not global_ranks_in_group:  # the default group: later groups inherit what it asked for
            _state["default_asked"] = asked
        elif asked in ("prism", "undefined"):
            asked = _state.get("default_asked", asked)
        if not global_ranks_in_group:
            unsupported.check_backend(asked, desc)  # the default group: any other is refused at its first op
        _state["asked"].append((asked, desc))
        # `device_id` (init_process_group(device_id=...)) makes torch connect the group's backend for that
        # device eagerly, but prism's group is the process group itself (no per-device backend): it is
        # bound to the device afterwards, and connects when first used.
        device_id = kwargs.pop("device_id", None)
        if len(args) >= 4:
            device_id, args = args[3], args[:3] + (None,) + args[4:]
        try:
            result = original(group_size, group_rank, global_ranks_in_group, "prism", store, group_name,
                              *args, **kwargs)
        finally:
            _state["asked"].pop()
        pg = result[0] if isinstance(result, tuple) else result
        if device_id is not None and isinstance(pg, PrismProcessGroup):
            pg.bound_device_id = device_id
        if isinstance(pg, PrismProcessGroup) and unsupported.uncarried(asked):
            pg.uncarried = (asked, desc)
        _report_asked_backend(result, asked)
        return result

    c10d._new_process_group_helper = helper
    unsupported.guard_direct_backends()  # a communicator built from its class would bypass the interception
    _coalesce_cuda_p2p_batches()
    atexit.register(finish)


def _coalesce_cuda_p2p_batches() -> None:
    """`batch_isend_irecv` coalesces only for a group whose type is exactly `ProcessGroup`; prism's group
    (a subclass) would get one plain NCCL op after the other, and a ring of them deadlocks (each rank's
    send waits for a recv its peer has not issued). On CUDA tensors, prism's group coalesces them as
    torch does for NCCL (one NCCL group, one work for the batch); CPU batches are unchanged."""
    original = c10d.batch_isend_irecv
    if getattr(original, "_prism", False):
        return

    def batch_isend_irecv(p2p_op_list):
        group = (p2p_op_list[0].group or c10d._get_default_group()) if p2p_op_list else None
        device = p2p_op_list[0].tensor.device if p2p_op_list else None
        if not isinstance(group, PrismProcessGroup) or device.type != "cuda":
            return original(p2p_op_list)
        c10d._check_p2p_op_list(p2p_op_list)
        with c10d._coalescing_manager(group, device, async_ops=True) as cm:
            for op in p2p_op_list:
                peer = {"group_dst" if op.op is c10d.isend else "group_src": op.group_peer}
                op.op(op.tensor, group=op.group, tag=op.tag, **peer)
        return cm.works

    batch_isend_irecv._prism = True
    c10d.batch_isend_irecv = dist.batch_isend_irecv = batch_isend_irecv


def _report_asked_backend(result, asked: str) -> None:
    """`dist.get_backend(group)` answers what the program asked for ("gloo", "nccl"), not "prism"."""
    pg = result[0] if isinstance(result, tuple) else result
    world = c10d._world
    if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER or pg not in world.pg_map:
        return
    _, store = world.pg_map[pg]
    world.pg_map[pg] = (asked, store)
    try:
        world.pg_backend_config[pg] = str(c10d.BackendConfig(c10d.Backend(asked)))
    except (ValueError, TypeError, AttributeError):
        pass


def install_from_env() -> None:
    install(os.environ["PRISM_MODE"], os.environ.get("PRISM_OUT") or None)


def start_rank() -> None:
    """In a freshly forked rank, before the program runs (capture: wait for a device slot)."""
    if modes.get(_state["mode"]).coordinator:
        capture.client().start()
    oom.apply_limit()  # --rank-memory-gb: after the slot, so that CUDA starts where the rank runs


def finish(code: int = 0) -> None:
    """Complete what is in flight and publish the rank's trace (called at exit; safe to call twice)."""
    if _state.get("finished"):
        return
    _state["finished"] = True
    watchdog.stop()
    linked = capture.linked()  # capture mode, in a rank (not in the zygote)
    if linked and code == 0:
        capture.client().drain()
    rec = _state["recorder"]
    if rec is not None and code == 0:
        rec.close()
    if _state["mode"] == "emulate" and code == 0:
        from prism.runtime.emulate import transport as emulation

        emulation.write_rank_stats(int(os.environ.get("RANK", "0")))
    if linked:
        capture.client().finish(code)
