"""Device-state swapping on CPU with a fake device: the policy (whoever fits stays resident), the CUDA
checkpoint device state's accounting, and the clear errors (capacity below one rank's footprint, a driver
without the checkpoint API, no driver at all) -- never a hang."""

from __future__ import annotations

import ctypes

import pytest

from prism.runtime.capture import cuda_checkpoint
from prism.runtime.capture import device_state
from prism.runtime.capture.coordinator import Coordinator
from prism.runtime.capture.device_state import CudaCheckpoint, SwapError, SwapPolicy


class FakeCheckpointer:
    """Moves nothing; remembers the requests and answers as the helper would."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.requests: list[tuple[str, int]] = []
        self.state: dict[int, str] = {}
        self.fail_on = fail_on
        self.closed = False

    def request(self, action: str, pid: int) -> tuple[float, str]:
        if pid == self.fail_on:
            raise cuda_checkpoint.CheckpointError("cuCheckpointProcessLock of process 7 failed: CUDA error 1")
        want = {"suspend": "running", "resume": "checkpointed"}[action]
        assert self.state.get(pid, "running") == want, f"{action} of {pid} in state {self.state.get(pid)}"
        self.state[pid] = "checkpointed" if action == "suspend" else "running"
        self.requests.append((action, pid))
        return 0.25, ""

    def close(self) -> None:
        self.closed = True


def test_policy_skips_ranks_holding_nothing_and_forgets_exited_ones() -> None:
    p = SwapPolicy(slots=1, capacity_bytes=100)
    assert p.grant(0, 0, 0) == []          # rank 0 has not touched the device yet
    assert p.grant(0, 1, 70) == []
    assert p.grant(0, 2, 60) == [("suspend", 1)]   # rank 0 (least recent) holds nothing: rank 1 goes
    p.forget(2)                             # rank 2 exited: its 60 bytes are free
    assert p.grant(0, 1, 70) == [("resume", 1)]
    assert p.suspended == set() and dict(p.resident[0]) == {0: 0, 1: 70}


def test_capacity_below_one_rank_is_a_clear_error() -> None:
    p = SwapPolicy(slots=1, capacity_bytes=2**30)
    with pytest.raises(SwapError, match=r"rank 3 holds 1.500 GiB .* more than the device capacity 1.000 GiB"):
        p.grant(0, 3, 3 * 2**29)


def test_coordinator_swaps_through_the_cuda_device_state() -> None:
    """Four ranks on one slot, capacity for two: each grant of a rank that is not resident moves state;
    the fake device sees only legal transitions (suspend a running process, resume a checkpointed one)."""
    fake = FakeCheckpointer()
    dev = CudaCheckpoint(fake)
    c = Coordinator(4, 1, policy=SwapPolicy(1, capacity_bytes=100), sticky=dev.sticky)
    pids = {r: 1000 + r for r in range(4)}

    def apply():
        for action, victim in c.device_actions:
            getattr(dev, action)(pids[victim], c.footprint[victim])
        c.device_actions.clear()

    c.handle(0, ("group", "g", "dp", (0, 1, 2, 3)))
    for r in range(4):
        c.handle(r, ("hello",))
    key = ("c", "g", 0)
    order = []
    running = 0
    for _ in range(4):  # each rank arrives at the collective and waits, holding 40 bytes
        c.handle(running, ("arrive", key, (0, 1, 2, 3), ("all_reduce", "float32", "4", 16, "member")))
        grants = c.handle(running, ("wait", [key], 10, 40))
        apply()
        order.append(running)
        if grants:
            running = grants[0][0]
    assert sorted(order) == [0, 1, 2, 3]
    # ranks 0,1 fit (80 of 100); rank 2 holds 0 when granted (first run) ... then the collective completes
    # and everyone runs again: the least recently run go out to make room
    stats = dev.stats()
    assert stats["swaps_out"] == len([a for a, _ in fake.requests if a == "suspend"]) > 0
    assert stats["swaps_in"] == len([a for a, _ in fake.requests if a == "resume"])
    assert stats["swap_out_bytes"] == 40 * stats["swaps_out"] and stats["swap_out_s"] == 0.25 * stats["swaps_out"]
    resident = [r for r in range(4) if fake.state.get(pids[r], "running") == "running"]
    assert len(resident) <= 2 + 1  # at most what fits, plus the one that runs (footprint not yet re-reported)
    dev.close()
    assert fake.closed


def test_a_failed_move_is_a_swap_error_naming_the_process() -> None:
    dev = CudaCheckpoint(FakeCheckpointer(fail_on=7))
    with pytest.raises(SwapError, match="suspend of process 7: cuCheckpointProcessLock"):
        dev.suspend(7, 10)


def test_for_device() -> None:
    assert device_state.for_device("cpu").stats() == {}
    assert device_state.for_device("cuda").sticky is True      # no capacity: nothing moves
    with pytest.raises(SwapError, match="PRISM_DEVICE=cuda"):
        device_state.for_device("cpu", 2**30)


def test_driver_without_the_checkpoint_api(monkeypatch) -> None:
    class OldDriver:  # cuDriverGetVersion only
        def cuDriverGetVersion(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int)).contents.value = 12040
            return 0

    monkeypatch.setattr(cuda_checkpoint.ctypes, "CDLL", lambda name: OldDriver())
    monkeypatch.setattr(cuda_checkpoint.ctypes, "byref", lambda obj: ctypes.pointer(obj))
    with pytest.raises(cuda_checkpoint.CheckpointError, match=r"API 12.4\) has no checkpoint API .* R570"):
        cuda_checkpoint.Driver()


def test_probe_names_the_cause_without_hanging() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        why = cuda_checkpoint.probe()
        assert why is not None and "libcuda.so.1" in why
    else:
        pytest.skip("this host has a CUDA driver (tests/gpu/test_swap.py covers it)")
