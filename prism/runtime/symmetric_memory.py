"""Async TP in the modes where prism computes the collectives (capture, slice, emulate), and a clear refusal of
the rest of torch's symmetric memory there.

Async TP (torchtitan's `enable_async_tensor_parallel`: `torch._inductor.config._micro_pipeline_tp` and symmetric
memory for the TP group) has inductor rewrite all-gather + matmul into `symm_mem::fused_all_gather_matmul` and
matmul + reduce-scatter into `symm_mem::fused_matmul_reduce_scatter` (and their fp8 scaled forms). Their CUDA
kernels micro-pipeline the two through symmetric memory: every rank of the group maps its peers' buffers, so
every rank must be live on its own GPU at once. In capture (ranks take turns on a few device slots), slice and
emulate (peers replayed) that cannot be; prism's collectives can. torch ships each fused op's decomposition into
functional collectives (its Meta kernel, and what its CUDA kernel runs under `_symmetric_memory._test_mode`):
`install()` makes torch's own function the op's CPU and CUDA kernel in this process, so the op runs as an
all-gather then matmuls (a matmul then a reduce-scatter) through prism's groups, recorded and replayed as any
other collective. The micro-pipelined overlap is not modelled: what prism times is that fallback.

Every other `symm_mem` op (one_shot_all_reduce, all_to_all_vdev, the NVSHMEM and NCCL ones, ...) and the
allocation and rendezvous of symmetric buffers (`symm_mem.empty`, `rendezvous`, `get_symm_mem_workspace`, via
`_SymmetricMemory.empty_strided_p2p` and `.rendezvous`) raise `UnsupportedFeature` naming the op and rank:
torch has no decomposition of them and they need peers' memory. `enable_symm_mem_for_group` (deprecated, still
called by torchtitan) is left as torch has it: it only records the group's store.

Real mode installs nothing: it is torch's behaviour, errors included (on CPU the fused ops have no kernel).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed.distributed_c10d as c10d

from prism.runtime.unsupported import UnsupportedFeature, this_rank

# op -> the name of torch's fallback function in torch.distributed._symmetric_memory
CARRIED = {
    "fused_all_gather_matmul": "_fused_all_gather_matmul_fallback",
    "fused_all_gather_scaled_matmul": "_fused_all_gather_scaled_matmul_fallback",
    "fused_matmul_reduce_scatter": "_fused_matmul_reduce_scatter_fallback",
    "fused_scaled_matmul_reduce_scatter": "_fused_scaled_matmul_reduce_scatter_fallback",
}
DEVICES = ("CPU", "CUDA")
_BUFFER_APIS = ("empty", "rendezvous", "get_symm_mem_workspace", "get_mem_pool")  # symm_mem's that allocate/exchange
_BUFFER_CALLS = ("empty_strided_p2p", "rendezvous")  # `_SymmetricMemory`'s: every symmetric buffer passes them
_state: dict = {"library": None, "carried": (), "refused": ()}


def carried() -> tuple[str, ...]:
    """The symm_mem ops this process runs as torch's fallback (empty before `install`)."""
    return _state["carried"]


def refused() -> tuple[str, ...]:
    """The symm_mem ops this process refuses (empty before `install`)."""
    return _state["refused"]


def install() -> None:
    """Carry the fused ops as torch's fallback and refuse every other symm_mem op and symmetric buffer, for CPU and
    CUDA tensors, in this process (the zygote: the ranks it forks inherit it). Idempotent."""
    if _state["library"] is not None:
        return
    import torch.distributed._symmetric_memory as symm_mem  # defines the fused ops (Python-registered)

    listed = getattr(torch._C, "_dispatch_get_all_op_names", None)  # (a torch without it: the fused ops only)
    every = listed() if listed is not None else [f"symm_mem::{name}" for name in CARRIED]
    names = sorted(n.split("::", 1)[1] for n in every if n.startswith("symm_mem::"))
    library = torch.library.Library("symm_mem", "IMPL")
    carried_now, refused_now = [], []
    with warnings.catch_warnings():  # the dispatcher warns that a kernel is overridden (torch's CUDA ones)
        warnings.simplefilter("ignore")
        for name in names:
            fallback = getattr(symm_mem, CARRIED.get(name, ""), None)
            kernel = fallback if fallback is not None else _refusal(name, _group_arg(name))
            for device in DEVICES:
                _override(library, name, kernel, device)
            (carried_now if fallback is not None else refused_now).append(name)
    _guard_buffers(symm_mem)
    _state.update(library=library, carried=tuple(carried_now), refused=tuple(refused_now))


def _override(library, name: str, kernel, device: str) -> None:
    """`library.impl(name, kernel, device)` over a kernel torch registered from Python (symm_mem's own CUDA ones).
    torch 2.13 allows it (`allow_override`, on by default); torch 2.11 refuses it in Python alone, by its record of
    the Python-registered keys (`torch.library._impls`: "there's already a kernel registered from python"), while
    its dispatcher takes the override with a warning: the key is dropped from that record first."""
    try:
        library.impl(name, kernel, device, allow_override=True)
    except TypeError:  # a torch whose Library.impl has no allow_override
        getattr(torch.library, "_impls", set()).discard(f"{library.ns}/{name.split('::')[-1]}/{device}")
        library.impl(name, kernel, device)
    except RuntimeError as exc:
        if "already a kernel registered from python" not in str(exc):
            raise
        getattr(torch.library, "_impls", set()).discard(f"{library.ns}/{name.split('::')[-1]}/{device}")
        library.impl(name, kernel, device)


def _group_arg(name: str) -> int | None:
    """Where the op's schema takes its group's name (None: it takes none)."""
    packet = getattr(torch.ops.symm_mem, name.split(".")[0])
    overload = getattr(packet, name.split(".")[1] if "." in name else "default", None)
    if overload is None:
        return None
    names = [a.name for a in overload._schema.arguments]
    return names.index("group_name") if "group_name" in names else None


def _group_words(group_name) -> str:
    """' in group 0 (default_pg)', or the bare name when no group of this process has it."""
    try:
        group = c10d._resolve_process_group(group_name)
    except (RuntimeError, ValueError, KeyError):
        return f" in group {group_name}"
    desc = getattr(group, "group_desc", "") or "no description"
    return f" in group {group_name} ({desc})"


_WHY = ("torch's symmetric memory maps every rank's buffer into its peers' address space, so it needs every rank "
        "of the group live on its own GPU at once; in capture, slice and emulate prism runs the ranks a few at a "
        "time or replays them, and torch has no decomposition of it into collectives prism could carry instead "
        f"(prism carries async TP's {', '.join(CARRIED)} as torch's own fallback: an all-gather then the matmul, a "
        "matmul then the reduce-scatter)")
_FIX = ("Fix: use torch.distributed collectives (or the fused async-TP ops) instead, or run the program in real "
        "mode (prism launch --mode real) on a GPU a rank")


def _refusal(name: str, group_at: int | None):
    def refuse(*args, **kwargs):
        group = kwargs.get("group_name", args[group_at] if group_at is not None and group_at < len(args) else None)
        where = _group_words(group) if group is not None else ""
        raise UnsupportedFeature(f"rank {this_rank()}: torch.ops.symm_mem.{name}{where}: {_WHY}. {_FIX}")

    refuse.__name__ = f"prism_refuses_{name.replace('.', '_')}"
    return refuse


def _group_of(api: str, args: tuple, kwargs: dict):
    """The group an API call names (a name or a ProcessGroup), or None."""
    at = {"rendezvous": (1, "group"), "get_symm_mem_workspace": (0, "group_name")}.get(api)
    if at is None:
        return kwargs.get("group_name")
    group = kwargs.get(at[1], args[at[0]] if len(args) > at[0] else None)
    return getattr(group, "group_name", group)


def _guard_buffers(symm_mem) -> None:
    """Make the APIs that allocate or exchange symmetric buffers an `UnsupportedFeature`, naming the one the program
    called: the module's (`symm_mem.empty`, `rendezvous`, `get_symm_mem_workspace`, `get_mem_pool`), and the two
    `_SymmetricMemory` calls every buffer goes through, for torch's own callers (inductor's code, FSDP2's)."""
    cls = torch._C._distributed_c10d._SymmetricMemory
    targets = [(symm_mem, api, f"torch.distributed._symmetric_memory.{api}", False) for api in _BUFFER_APIS]
    targets += [(cls, m, f"torch's _SymmetricMemory.{m}", True) for m in _BUFFER_CALLS]
    for owner, attr, api, static in targets:
        original = getattr(owner, attr, None)
        if original is None or getattr(original, "_prism_guard", False):  # (None: not in this torch)
            continue

        def guarded(*args, _api=api, _attr=attr, **kwargs):
            group = _group_of(_attr, args, kwargs)
            where = _group_words(group) if group is not None else ""
            raise UnsupportedFeature(f"rank {this_rank()}: {_api} (a symmetric memory buffer){where}: {_WHY}. {_FIX}")

        guarded._prism_guard = True
        setattr(owner, attr, staticmethod(guarded) if static else guarded)
