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

from prism import settings

from prism.runtime import markers, modes, oom, symmetric_memory, unsupported, watchdog
from prism.runtime.capture import client as capture_client
from prism.runtime.capture import nonmember_groups
from prism.runtime.launch import progress
from prism.runtime.backend import PrismProcessGroup
from prism.runtime.recorder import Recorder
from prism.runtime.slice.transport import SliceRecorder

# imported with the interception, as before modes named their transports: in the zygote, before the ranks
# are forked, so that they share these pages (emulate's transport is imported at a sandbox rank's first group)
from prism.runtime import transport as _real_transport  # noqa: F401,E402
from prism.runtime.capture import transport as _capture_transport  # noqa: F401,E402

MODES = tuple(name for name, m in modes.MODES.items() if m.intercepted)

_state: dict = {"installed": False, "recorder": None, "hooks": None, "asked": [], "mode": None, "out": None,
                "wanted": False, "suspended": False}
_GROUPS: list = []  # the PrismProcessGroups this process created (suspend/resume detach and restore their recorder)


def recorder() -> Recorder | None:
    return _state["recorder"]


oom.locate_with(recorder)  # an out-of-memory failure says where the rank was


def _ensure_recorder() -> Recorder | None:
    if _state["hooks"] is None:
        rec = None
        if _state["out"] is not None:
            rank = int(os.environ.get("RANK", "0"))
            device = "cuda" if torch.cuda.is_available() and settings.DEVICE.get() == "cuda" else "cpu"
            if modes.get(_state["mode"]).recorder == "checked":  # checks every op against the capture as issued
                rec = SliceRecorder(rank, _state["out"], Path(settings.CAPTURE.get()), device=device)
            else:
                rec = Recorder(rank, _state["out"], device=device)
        _state["recorder"] = rec
        drain = _drain if modes.get(_state["mode"]).coordinator else None
        wanted = rec or drain or os.environ.get(progress.ENV)  # progress: iteration ends even with nothing recorded
        _state["wanted"] = bool(wanted)
        _state["hooks"] = markers.install(rec, on_boundary=drain) if wanted else []
    return _state["recorder"]


def suspend() -> None:
    """Take PrismTrace's per-step work out of a running real-mode rank, between two steps (`prism bench overhead
    --interleave`): the markers' global hooks are removed (torch's module and optimizer hook dicts no longer
    hold them) and every prism group's recorder is detached (its ops are issued with no record, no clock read,
    no CUDA event). What stays, as it cannot be taken out of a running program: prism's process groups
    themselves (the objects the program holds; an op still passes their Python `_issue`) and the hang
    watchdog's helper thread (real mode; it polls once a second). `resume()` puts everything back."""
    if _state["hooks"] is None:
        raise RuntimeError("interception.suspend: no process group yet, so nothing is recording: suspend "
                           "between steps, after the program's init_process_group")
    if modes.get(_state["mode"]).coordinator or modes.get(_state["mode"]).recorder != "plain":
        raise RuntimeError(f"interception.suspend: mode {_state['mode']!r} cannot run without its hooks "
                           "(they are its drain points or its checks); only real mode can be suspended")
    if settings.ITERATION_FN.raw() or settings.MICROBATCH_FN.raw():
        raise RuntimeError("interception.suspend: named boundaries (--iteration-fn/--microbatch-fn) wrap the "
                           "program's functions, which cannot be unwrapped while it runs")
    if _state["suspended"]:
        return
    for handle in _state["hooks"]:
        handle.remove()
    _state["again"] = getattr(_state["hooks"], "again", None)  # resume registers the same hook functions
    _state["hooks"] = []
    for pg in _GROUPS:
        pg._rec = None
    _state["suspended"] = True


def resume() -> None:
    """Undo `suspend()`: the hooks `markers.install` gave the rank at its first group registered again (the same
    functions and their state), the groups' recorder back; the time since suspending is no event's
    (`Recorder.resync`)."""
    if not _state["suspended"]:
        return
    rec = _state["recorder"]
    if rec is not None:
        rec.resync()
    drain = _drain if modes.get(_state["mode"]).coordinator else None
    again = _state.pop("again", None)
    if not _state["wanted"]:
        _state["hooks"] = []
    elif again is not None:  # the hooks `markers.install` made at the rank's first group, registered again (a
        _state["hooks"] = again()  # new install a switch made ~100 objects, whose collection then fell in on steps)
    else:
        _state["hooks"] = markers.install(rec, on_boundary=drain)
    for pg in _GROUPS:
        pg._rec = rec
    _state["suspended"] = False


def suspended() -> bool:
    return _state["suspended"]


def _drain() -> None:
    """A capture drain point: complete pending ops; the parked time is no one's compute."""
    if capture_client.client().drain() and _state["recorder"] is not None:
        _state["recorder"].resync()


def _create(dist_opts, backend_options) -> PrismProcessGroup:
    asked, desc, ranks = _state["asked"][-1] if _state["asked"] else ("gloo", None, None)
    # the members from the list torch's helper was given (`helper` below): its int objects, the program's, are
    # shared; `dist_opts.global_ranks_in_group` is a C++ vector that makes a new int per member (> 256) at each
    # read, which the group would keep for the rank's life (~32 B a member: 96 KiB at W=8192 weak, the rank's
    # dp and edp groups of 2,048 and 1,024). The same ranks, in the same order: torch sets that vector from it.
    if ranks is None or len(ranks) != dist_opts.group_size:
        ranks = dist_opts.global_ranks_in_group
    members = list(ranks) or list(range(dist_opts.group_size))
    name = str(dist_opts.group_id)
    rec = _ensure_recorder()
    transport = modes.get(_state["mode"]).make_transport(dist_opts, name, members, desc, asked, rec)
    if rec is not None:
        rec.add_group(name, desc, members, asked)
    real = "nccl" if "nccl" in asked and torch.cuda.is_available() else "gloo"
    pg = PrismProcessGroup(dist_opts.group_rank, dist_opts.group_size, members, name, desc, transport, rec,
                           backend_name=real)
    pg.computes = modes.get(_state["mode"]).computes  # only what prism's semantics define
    pg.float8_as_bytes = getattr(transport, "FLOAT8_AS_BYTES", False)  # (`float8_over_gloo`)
    if _state["suspended"]:
        pg._rec = None
    _GROUPS.append(pg)
    return pg


def install(mode: str, out_dir: str | Path | None) -> None:
    """Route every process group through prism's backend in `mode`, recording to `out_dir` (or not)."""
    if mode not in MODES:
        raise ValueError(f"PRISM_MODE={mode!r} is not a mode of this prism (modes: {', '.join(MODES)})")
    mode_ = modes.get(mode)
    if _state["installed"]:
        return
    _state.update(installed=True, mode=mode, out=Path(out_dir) if out_dir else None)
    dist.Backend.register_backend("prism", _create, extended_api=True, devices=["cpu", "cuda"])
    if mode_.computes:  # async TP's fused ops as torch's fallback through prism's groups; other symm_mem refused
        symmetric_memory.install()
    if mode_.coordinator:
        capture_client.install_future_helpers()
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
        _state["asked"].append((asked, desc, global_ranks_in_group))
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
    install(settings.MODE.get(), settings.OUT.get() or None)


def start_rank() -> None:
    """In a freshly forked rank, before the program runs (capture: wait for a device slot)."""
    if modes.get(_state["mode"]).coordinator:
        capture_client.client().start()
    oom.apply_limit()  # --rank-memory-gb: after the slot, so that CUDA starts where the rank runs


def finish(code: int = 0) -> None:
    """Complete what is in flight and publish the rank's trace (called at exit; safe to call twice)."""
    if _state.get("finished"):
        return
    _state["finished"] = True
    watchdog.stop()
    linked = capture_client.linked()  # capture mode, in a rank (not in the zygote)
    if linked and code == 0:
        capture_client.client().drain()
    rec = _state["recorder"]
    if rec is not None and code == 0:
        rec.close()
    if modes.get(_state["mode"]).sandbox and code == 0:  # the sandbox rank's transports' numbers
        from prism.runtime.emulate.works import write_rank_stats

        write_rank_stats(int(os.environ.get("RANK", "0")))
    if linked:
        capture_client.client().finish(code)
