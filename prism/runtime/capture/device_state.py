"""Device-state preservation in capture: where a waiting rank's device memory lives, and when it moves.

Interface: a `DeviceState` suspends a rank (moves its device memory to host) and resumes it, by process
id, from the coordinator's process. On CPU a waiting rank simply keeps its memory in RAM (`HostMemory`,
nothing to do); so does a rank on CUDA when no capacity is set (every rank keeps its device memory). With
`--device-memory-gb` on CUDA, `CudaCheckpoint` moves it through the driver's checkpoint API
(prism/runtime/capture/cuda_checkpoint.py, DESIGN §2) and counts swaps, bytes and seconds.

Decisions (`SwapPolicy`, pure): each device slot keeps the ranks whose state is resident on it. Granting
the slot to a rank that is not resident needs room for that rank's footprint (its caching allocator's
reserved bytes when it last blocked; the CUDA context itself is not counted); the policy suspends the
least recently run resident ranks that hold memory (never the one running) until it fits, and resumes
the incoming rank: whoever fits stays resident. With no capacity limit nothing is ever suspended. On
CUDA a rank's context is bound to its GPU, so a rank always comes back to the same slot (`sticky`). A
rank whose footprint alone exceeds the capacity is an error naming the rank and the fix (`SwapError`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class SwapError(RuntimeError):
    """Device state cannot be kept within the capacity, or moving it failed: capture stops with this message."""


class DeviceState(Protocol):
    sticky: bool

    def suspend(self, pid: int, nbytes: int = 0) -> None: ...

    def resume(self, pid: int, nbytes: int = 0) -> None: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...


class HostMemory:
    """CPU (or CUDA without a capacity): a waiting rank's memory stays where it is."""

    def __init__(self, sticky: bool = False) -> None:
        self.sticky = sticky

    def suspend(self, pid: int, nbytes: int = 0) -> None:
        pass

    def resume(self, pid: int, nbytes: int = 0) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class CudaCheckpoint:
    """CUDA with a capacity: a suspended rank's device state goes to host memory (checkpoint) and back."""

    sticky = True

    def __init__(self, checkpointer=None) -> None:
        if checkpointer is None:
            from prism.runtime.capture.cuda_checkpoint import CheckpointError, Checkpointer

            try:
                checkpointer = Checkpointer()
            except CheckpointError as exc:
                raise SwapError(str(exc)) from None
        self.ckpt = checkpointer
        self.counts = {"swaps_out": 0, "swaps_in": 0, "swap_out_bytes": 0, "swap_in_bytes": 0,
                       "swap_out_s": 0.0, "swap_in_s": 0.0}

    def _move(self, action: str, direction: str, pid: int, nbytes: int) -> None:
        from prism.runtime.capture.cuda_checkpoint import CheckpointError

        try:
            secs, _ = self.ckpt.request(action, pid)
        except CheckpointError as exc:
            raise SwapError(f"{action} of process {pid}: {exc}") from None
        self.counts[f"swaps_{direction}"] += 1
        self.counts[f"swap_{direction}_bytes"] += nbytes
        self.counts[f"swap_{direction}_s"] += secs

    def suspend(self, pid: int, nbytes: int = 0) -> None:
        self._move("suspend", "out", pid, nbytes)

    def resume(self, pid: int, nbytes: int = 0) -> None:
        self._move("resume", "in", pid, nbytes)

    def stats(self) -> dict:
        return dict(self.counts)

    def close(self) -> None:
        self.ckpt.close()


def for_device(kind: str, capacity_bytes: int | None = None) -> DeviceState:
    """The device state of capture on `kind` ("cpu" or "cuda") with `capacity_bytes` per slot (None: no limit)."""
    if kind == "cpu":
        if capacity_bytes is not None:
            raise SwapError("a device-memory capacity applies to CUDA ranks: set PRISM_DEVICE=cuda or drop it")
        return HostMemory()
    if kind == "cuda":
        return CudaCheckpoint() if capacity_bytes is not None else HostMemory(sticky=True)
    raise SwapError(f"no device-state support for device kind {kind!r} (cpu or cuda)")


class SwapPolicy:
    """Which ranks' device state must leave a slot before another rank runs there."""

    def __init__(self, slots: int, capacity_bytes: int | None = None) -> None:
        self.capacity = capacity_bytes
        # per slot: resident ranks, least recently run first -> footprint in bytes
        self.resident: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(slots)]
        self.where: dict[int, int] = {}  # rank -> its slot (device state is bound to one device)
        self.suspended: set[int] = set()

    def update(self, rank: int, footprint: int) -> None:
        """A rank reported how much device memory it holds."""
        slot = self.where.get(rank)
        if slot is not None and rank in self.resident[slot]:
            self.resident[slot][rank] = footprint

    def forget(self, rank: int) -> None:
        """The rank exited: its device memory is gone."""
        slot = self.where.pop(rank, None)
        if slot is not None:
            self.resident[slot].pop(rank, None)
        self.suspended.discard(rank)

    def grant(self, slot: int, rank: int, footprint: int) -> list[tuple[str, int]]:
        """`rank` is about to run on `slot`: the ("suspend", r) / ("resume", r) actions that must come first."""
        if self.capacity is None:  # host memory: nothing ever has to move
            return []
        if footprint > self.capacity:
            raise SwapError(f"rank {rank} holds {footprint / 2**30:.3f} GiB of device memory, more than the "
                            f"device capacity {self.capacity / 2**30:.3f} GiB (--device-memory-gb): raise "
                            "--device-memory-gb above one rank's footprint")
        assert self.where.get(rank, slot) == slot, "a rank's device state is bound to its slot"
        res = self.resident[slot]
        was_resident = res.pop(rank, None) is not None
        actions: list[tuple[str, int]] = []
        used = sum(res.values())
        for victim in list(res):  # least recently run first
            if used + footprint <= self.capacity:
                break
            if not res[victim]:  # holds nothing: suspending it frees no room
                continue
            used -= res.pop(victim)
            self.suspended.add(victim)
            actions.append(("suspend", victim))
        if not was_resident and rank in self.suspended:
            self.suspended.discard(rank)
            actions.append(("resume", rank))
        res[rank] = footprint
        self.where[rank] = slot
        return actions
