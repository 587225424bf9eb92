"""Transports: where a collective's data actually goes.

The prism backend (`backend.PrismProcessGroup`) is the same in every mode; a transport does the data
movement. A transport offers the methods below with the `torch.distributed.Backend` calling convention
and returns a c10d `Work`. `RealTransport` (mode `real`) hands every call to the job's real backend:
gloo for CPU tensors, NCCL for CUDA tensors when the program asked for NCCL. In mode `slice` the same
transport runs over a store whose key space the replay server can predict (`slice_store`), so that the
server can stand in for the group's virtual members.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Work

from prism.runtime import ops


class Transport(Protocol):
    """The data movement of one process group (one instance per group and rank)."""

    def call(self, method: str, device: torch.device, *args, work_id: int = -1, op: str = "") -> Work: ...

    def start_coalescing(self, device: torch.device) -> None: ...

    def end_coalescing(self, device: torch.device) -> Work | None: ...




# Mode `slice`: the stores of every group live under this prefix of the job's store (the supervisor's).
SLICE_PREFIX = "prism-slice"


def job_store(store):
    """The job's store under torch's prefixes (`default_pg/`, `<group>/`): the store a group was made with."""
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store


def slice_store(group_name: str, base):
    """The store of group `group_name` in mode `slice`: `SLICE_PREFIX/<group>/` on the job's store `base`.

    Group names are torch's (creation order: the same in every run of the program), so the replay server
    reaches the same keys for the group's virtual members."""
    return PrefixStore(f"{SLICE_PREFIX}/{group_name}/", job_store(base))


class RealTransport:
    """Delegates to gloo (CPU) and, when asked for and available, NCCL (CUDA)."""

    def __init__(self, store, group_rank: int, group_size: int, timeout: timedelta | None,
                 want_nccl: bool, global_ranks: list[int], group_name: str) -> None:
        self._store = store
        self._rank, self._size = group_rank, group_size
        self._timeout = timeout or timedelta(minutes=30)
        self._global_ranks, self._group_name = global_ranks, group_name
        self._want_nccl = want_nccl and torch.cuda.is_available()
        self._backends: dict[str, object] = {}
        # gloo is always there: rendezvous now, while every member is creating the group. `call` takes it
        # straight for a CPU tensor: an op's issue span is the program's own cost plus this path's, so the
        # path is kept as short as a real rank's in every mode that subclasses this one (a slice rank's op
        # issue cost 10-20 us more CPU than the truth's on the host through two overridden look-ups:
        # docs/fidelity.md, session 17)
        self._cpu = self._gloo()

    def _gloo(self):
        pg = self._backends.get("cpu")
        if pg is None:
            pg = ProcessGroupGloo(PrefixStore("gloo/", self._store), self._rank, self._size, self._timeout)
            pg.options.global_ranks_in_group = self._global_ranks
            pg.options.group_name = self._group_name
            self._backends["cpu"] = pg
        return pg

    def _nccl(self):
        pg = self._backends.get("cuda")
        if pg is None:
            opts = dist.ProcessGroupNCCL.Options()
            opts.global_ranks_in_group = self._global_ranks
            opts.group_name = self._group_name
            opts._timeout = self._timeout
            pg = dist.ProcessGroupNCCL(PrefixStore("nccl/", self._store), self._rank, self._size, opts)
            self._backends["cuda"] = pg
        return pg

    def backend_for(self, device: torch.device):
        if device.type == "cuda" and self._want_nccl:
            return self._nccl()
        return self._gloo()

    def call(self, method: str, device: torch.device, *args, work_id: int = -1, op: str = "") -> Work:
        backend = self._cpu if device.type == "cpu" else self.backend_for(device)
        return getattr(backend, ops.BACKEND_METHOD.get(method, method))(*args)

    def start_coalescing(self, device: torch.device) -> None:
        backend = self.backend_for(device)
        if backend.supports_coalescing:
            backend._start_coalescing()

    def end_coalescing(self, device: torch.device) -> Work | None:
        backend = self.backend_for(device)
        if backend.supports_coalescing:
            return backend._end_coalescing()
        return None


def for_group(opts, name: str, members: list[int], desc: str | None, asked: str, rec) -> RealTransport:
    """Mode real (`modes`): the backend the program asked for, with this rank's hang watchdog."""
    import os

    from prism.runtime import watchdog

    transport = RealTransport(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                              want_nccl="nccl" in asked or asked == "undefined", global_ranks=members, group_name=name)
    watchdog.start(job_store(opts.store), int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    return transport
