"""Mode emulate's pieces that need no processes: the mode table, participants, tags, contribution blobs."""

from __future__ import annotations

import pytest
import torch

from prism.runtime import modes
from prism.runtime.emulate import transport as emulate_transport


def test_every_mode_is_described_once():
    assert list(modes.MODES) == ["off", "real", "capture", "slice", "emulate"]
    assert [n for n, m in modes.MODES.items() if m.replay] == ["slice", "emulate"]
    assert modes.get("emulate").ranks_option == "--sandbox" and modes.partial("emulate")
    assert not modes.partial("capture") and modes.get("capture").coordinator
    with pytest.raises(ValueError, match="not a mode of this prism"):
        modes.get("bogus")


def test_participants_pruned_and_not():
    members = [0, 1, 2, 3, 4, 5]
    assert emulate_transport.participants(members, {2}, True) == [(0, [0, 1]), (2, [2]), (3, [3, 4, 5])]
    assert emulate_transport.participants(members, {0, 3}, True) == [(0, [0]), (1, [1, 2]), (3, [3]), (4, [4, 5])]
    assert emulate_transport.participants(members, {2}, False) == [(m, [m]) for m in members]


def test_p2p_tags_tell_members_of_one_compensator_apart():
    n = 4
    tags = {emulate_transport.p2p_tag(t, n, s, d) for t in range(3) for s in range(n) for d in range(n)}
    assert len(tags) == 3 * n * n and max(tags) < emulate_transport.COLL_TAG


def test_blob_round_trip_keeps_members_metas_and_bits():
    a = torch.randn(3, 2)
    b = torch.arange(5, dtype=torch.int64)
    c = torch.randn(4).to(torch.bfloat16)
    blob = emulate_transport.encode_parts([(2, {"op": "all_reduce"}, [a]), (3, {"splits": [1, 2]}, [b, c])])
    got = emulate_transport.decode_parts(blob)
    assert sorted(got) == [2, 3]
    assert got[2][0] == {"op": "all_reduce"} and torch.equal(got[2][1][0], a)
    assert got[3][0] == {"splits": [1, 2]} and torch.equal(got[3][1][0], b) and torch.equal(got[3][1][1], c)
    assert emulate_transport.decode_parts(emulate_transport.encode_parts([])) == {}


def test_native_work_completes_once_after_the_hold_through_wait_and_future():
    """An all-sandbox group's native op (`NativeWork`): the future (DDP's path) and `wait` both complete
    it, its completion runs once, and neither answers before the transfer hold's floor."""
    import time
    from datetime import timedelta

    from torch._C._distributed_c10d import HashStore, ProcessGroupGloo

    from prism.runtime.emulate.works import NativeWork

    pg = ProcessGroupGloo(HashStore(), 0, 1, timedelta(seconds=30))
    out = torch.zeros(3)
    calls = []
    start = time.monotonic_ns()
    work = NativeWork([pg.allreduce([torch.ones(3)])], lambda: calls.append(out.add_(1)), start + 150_000_000,
                       [out])
    future = work.get_future()
    assert work.wait() and time.monotonic_ns() - start >= 150_000_000
    assert future.wait() == [out] and work.is_completed()
    assert len(calls) == 1 and torch.equal(out, torch.ones(3))
    early = NativeWork([pg.barrier()], lambda: None, time.monotonic_ns() + 10**10, [])
    early.works[0].wait()
    assert not early.is_completed()  # done by gloo, but its floor is 10 s away


def test_emulated_work_is_held_to_its_floor_but_not_its_group_thread():
    """A protocol collective's work (`EmuWork`): the group's thread completes it and goes on at once (the
    next collective's exchange must not wait for this one's hold); `wait`, `is_completed` and the future
    answer only once the floor passed, each future at its own floor (a later op with an earlier floor
    first); an error reaches whoever waits."""
    import time

    from prism.runtime.emulate.works import EmuWork

    start = time.monotonic_ns()
    slow, quick = EmuWork(["slow"]), EmuWork(["quick"])
    slow_future, quick_future = slow.get_future(), quick.get_future()
    done = []
    slow_future.add_done_callback(lambda f: done.append(("slow", time.monotonic_ns() - start)))
    quick_future.add_done_callback(lambda f: done.append(("quick", time.monotonic_ns() - start)))
    slow.finish(start + 400_000_000)  # what the group thread does, one op after the other, without sleeping
    quick.finish(start + 100_000_000)
    assert time.monotonic_ns() - start < 100_000_000
    assert not slow.is_completed() and not quick.is_completed()
    assert quick.wait() and time.monotonic_ns() - start >= 100_000_000 and quick.is_completed()
    assert quick_future.wait() == ["quick"] and not slow.is_completed()
    assert slow_future.wait() == ["slow"] and time.monotonic_ns() - start >= 400_000_000 and slow.is_completed()
    deadline = time.monotonic() + 5
    while len(done) < 2 and time.monotonic() < deadline:  # (a callback runs just after its future's waiters wake)
        time.sleep(0.001)
    assert [name for name, _ in done] == ["quick", "slow"]
    assert done[0][1] >= 100_000_000 and done[1][1] >= 400_000_000
    failed = EmuWork([])
    future = failed.get_future()
    failed.fail(RuntimeError("gloo says no"))
    with pytest.raises(RuntimeError, match="gloo says no"):
        failed.wait()
    with pytest.raises(RuntimeError, match="gloo says no"):
        future.wait()


def test_cpu_tensors_need_no_stream_ordering():
    """The group thread orders itself after the caller's CUDA stream only for CUDA tensors
    (tests/gpu/test_stream_order_cuda.py checks the CUDA side)."""
    from prism.runtime.emulate.works import stream_order

    assert stream_order([torch.zeros(2), torch.ones(3)]) is None
    assert stream_order([]) is None


def test_a_sandbox_members_contribution_is_its_live_tensors_not_a_copy():
    """The issue of a protocol collective must cost what the job's issue does: a copy of the member's tensors
    on the program's thread made each DDP bucket's issue 0.1-0.5 ms longer than the slices' (session 19); the
    contribution is the live tensors, as a real backend reads them (the program may not change them before
    the op's wait), detached from autograd."""
    a = torch.arange(131072, dtype=torch.float32, requires_grad=True) * 1
    b = torch.ones(4, dtype=torch.int64)
    got = emulate_transport.contribution([a, b])  # (`pruned.contribution`)
    assert [t.data_ptr() for t in got] == [a.data_ptr(), b.data_ptr()]
    assert not any(t.requires_grad for t in got)
    assert torch.equal(got[0], a.detach()) and torch.equal(got[1], b)
