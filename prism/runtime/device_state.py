"""Device-state preservation in capture: where a waiting rank's device memory lives, and when it moves.

Interface: a `DeviceState` suspends a rank (moves its device memory to host) and resumes it, by process
id, from the coordinator's process. On CPU a waiting rank simply keeps its memory in RAM
(`HostMemory`, nothing to do). On CUDA the driver's checkpoint API (cuCheckpointProcessLock /
Checkpoint / Restore / Unlock, DESIGN §2) does it; that implementation arrives with the GPU path, and
asking for it before then is a clear error (`for_device`).

Decisions (`SwapPolicy`, pure): each device slot keeps the ranks whose state is resident on it. Granting
the slot to a rank that is not resident needs room for that rank's footprint; the policy suspends the
least recently run resident ranks (never the one running) until it fits, and resumes the incoming
rank. With no capacity limit (CPU) nothing is ever suspended. On CUDA a rank's context is bound to its
GPU, so a rank always comes back to the same slot (`sticky`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class DeviceState(Protocol):
    def suspend(self, pid: int) -> None: ...

    def resume(self, pid: int) -> None: ...


class HostMemory:
    """CPU: a waiting rank's tensors stay where they are (host RAM)."""

    sticky = False

    def suspend(self, pid: int) -> None:
        pass

    def resume(self, pid: int) -> None:
        pass


def for_device(kind: str) -> DeviceState:
    if kind == "cpu":
        return HostMemory()
    raise NotImplementedError(
        f"capture on {kind} devices needs the CUDA checkpoint implementation of DeviceState, which lands "
        "with the GPU path; capture on CPU (the default) works now")


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

    def grant(self, slot: int, rank: int, footprint: int) -> list[tuple[str, int]]:
        """`rank` is about to run on `slot`: the ("suspend", r) / ("resume", r) actions that must come first."""
        if self.capacity is None:  # host memory: nothing ever has to move
            return []
        assert self.where.get(rank, slot) == slot, "a rank's device state is bound to its slot"
        res = self.resident[slot]
        was_resident = res.pop(rank, None) is not None
        actions: list[tuple[str, int]] = []
        used = sum(res.values())
        for victim in list(res):  # least recently run first
            if used + footprint <= self.capacity:
                break
            used -= res.pop(victim)
            self.suspended.add(victim)
            actions.append(("suspend", victim))
        if not was_resident and rank in self.suspended:
            self.suspended.discard(rank)
            actions.append(("resume", rank))
        res[rank] = footprint
        self.where[rank] = slot
        return actions
