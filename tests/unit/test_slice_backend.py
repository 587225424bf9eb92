"""Which backend a slice rank's group carries CUDA tensors over (issue 21 item 3): the replay server's members are
gloo instances, so a group with a replayed member must use gloo even when the program asked for NCCL (session
12's H200 call: torchtitan's "nccl" default group hung the slice ranks in NCCL's initialisation). A group of
slice ranks only keeps what the program asked for, unless two of its members use one CUDA device (NCCL refuses
two ranks on one device: a W=8 FSDP2 4 x TP 2 slice that is a whole TP pair on one H200); then gloo too. Checked with CUDA reported available (no GPU needed: the
NCCL backend itself is never made here)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, PrefixStore

from prism import settings
from prism.runtime.slice import transport as slice_transport
from prism.runtime.slice.transport import SliceTransport
from prism.runtime.transport import RealTransport


def on_both_members(work) -> list:
    """`work(rank)` for members 0 and 1 at once, one thread each (named after its rank): their results."""
    got, errors = [None, None], []

    def one(rank: int) -> None:
        try:
            got[rank] = work(rank)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,), name=str(r)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return got


def transports(monkeypatch, slice_ranks: str, want_nccl: bool) -> list[SliceTransport]:
    """Both members of group [0, 1] (their gloo rendezvous needs both: one thread each)."""
    monkeypatch.setenv(settings.SLICE_RANKS.name, slice_ranks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(RealTransport, "_nccl", lambda self: "nccl")
    store = HashStore()
    return on_both_members(lambda rank: SliceTransport(store, rank, 2, timedelta(seconds=20), want_nccl=want_nccl,
                                                       global_ranks=[0, 1], group_name="0", results=None))


def test_a_group_with_a_replayed_member_carries_cuda_tensors_over_gloo(monkeypatch):
    for t in transports(monkeypatch, "0", want_nccl=True):  # rank 1 is the replay server's
        assert t.backend_for(torch.device("cuda", 0)) is t._gloo()
        assert t.backend_for(torch.device("cpu")) is t._gloo()


def cuda_backends(monkeypatch, made: list[SliceTransport], device_ids: list[str]) -> list:
    """Each member's backend for its first CUDA op, both at once (the members exchange their devices), member r
    on the CUDA device `device_ids[r]`."""
    monkeypatch.setattr(slice_transport, "cuda_device_id", lambda device: device_ids[int(threading.current_thread().name)])
    return on_both_members(lambda rank: made[rank].backend_for(torch.device("cuda", 0)))


def test_a_group_of_slice_ranks_keeps_the_nccl_it_asked_for(monkeypatch):
    made = transports(monkeypatch, "0,1", want_nccl=True)
    assert cuda_backends(monkeypatch, made, ["host/GPU-a", "host/GPU-b"]) == ["nccl", "nccl"]
    for t in made:
        assert t.backend_for(torch.device("cuda", 0)) == "nccl"  # decided once, at the first CUDA op
        assert t.backend_for(torch.device("cpu")) is t._gloo()


def test_a_group_of_slice_ranks_on_one_cuda_device_carries_cuda_tensors_over_gloo(monkeypatch):
    made = transports(monkeypatch, "0,1", want_nccl=True)  # NCCL refuses two ranks on one device
    assert cuda_backends(monkeypatch, made, ["host/GPU-a", "host/GPU-a"]) == [t._gloo() for t in made]
    for t in made:
        assert t.backend_for(torch.device("cuda", 0)) is t._gloo()


def test_the_device_id_names_the_host_and_the_physical_device(monkeypatch):
    class Props:
        uuid = "GPU-1234"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(slice_transport.socket, "gethostname", lambda: "h200")
    assert slice_transport.cuda_device_id(torch.device("cuda", 0)) == "h200/GPU-1234"


@pytest.mark.parametrize("slice_ranks", ["0", "0,1"])
def test_a_group_that_asked_for_gloo_stays_on_gloo(monkeypatch, slice_ranks):
    for t in transports(monkeypatch, slice_ranks, want_nccl=False):
        assert t.backend_for(torch.device("cuda", 0)) is t._gloo()


class _Results:
    """Captured results of group "0"'s collective #1 only (a real rank's values are replaced by 7s)."""

    def collective_seqs(self, group_name):
        return frozenset({1}) if group_name == "0" else frozenset()

    def take(self, key):
        from concurrent.futures import Future

        assert key == "c-0-1", key
        done = Future()
        done.set_result((None, [torch.full((4,), 7.0)]))
        return done


def test_an_op_without_a_captured_result_takes_a_real_ranks_path_itself(monkeypatch):
    """A slice rank's op issue is the real job's measurement: a group none of whose ops has a captured result
    issues through `RealTransport.call` itself (session 17: the slice's two overridden look-ups cost its ops
    10-20 us of CPU more than the truth's on the host); a group with one substitutes exactly that op's result."""
    monkeypatch.setenv(settings.SLICE_RANKS.name, "0,1")
    store = HashStore()
    for case, (name, results) in enumerate((("9", None), ("9", _Results()), ("0", _Results()))):
        made = on_both_members(lambda rank: SliceTransport(
            PrefixStore(f"case{case}/", store), rank, 2, timedelta(seconds=20), want_nccl=False, global_ranks=[0, 1],
            group_name=name, results=results))
        plain = name != "0"
        assert None not in made
        assert all((getattr(t.call, "__func__", None) is RealTransport.call) == plain for t in made)

        def three(rank):
            outs = []
            for _ in range(3):
                x = torch.full((4,), float(rank + 1))
                made[rank].call("allreduce", torch.device("cpu"), [x], dist.AllreduceOptions()).wait()
                outs.append(x[0].item())
            return outs

        got = on_both_members(three)
        assert got == [[3.0, 3.0, 3.0]] * 2 if plain else got == [[3.0, 7.0, 3.0]] * 2
