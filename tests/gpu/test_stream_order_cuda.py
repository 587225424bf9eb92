"""The emulated sandbox's group thread and the program's CUDA streams (issue 21 item 3): a collective called
from a side stream (FSDP2's all-gather and reduce-scatter streams) has its input written by a kernel queued
on that stream; the group thread, on the device's default stream, must read it only after that kernel ran
(`works.StreamOrder.inputs_ready`), and the caller must see the outputs the thread wrote
(`outputs_written`). A long kernel (`torch.cuda._sleep`) queued before the write makes the race certain
without the ordering."""

from __future__ import annotations

import threading

import pytest
import torch

from prism.runtime.emulate.works import stream_order
from tests.gpu.gpu_env import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]
SLEEP_CYCLES = 2_000_000_000  # ~1 s of GPU time before the write


def on_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()))
    t.start()
    t.join(60)
    return out["value"]


def test_the_group_thread_reads_an_input_after_the_side_stream_wrote_it():
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(7.0)
        clone = x.clone()  # as `EmulateTransport._collective` clones the contribution on the caller's stream
        order = stream_order([clone])

    def read():
        with order.device():
            order.inputs_ready()
            return clone.cpu()

    assert bool((on_thread(read) == 7.0).all())


def test_the_caller_sees_the_outputs_the_group_thread_wrote():
    side = torch.cuda.Stream()
    out = torch.zeros(1 << 20, device="cuda")
    src = torch.full((1 << 20,), 3.0, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        order = stream_order([out])

    def write():
        with order.device():
            order.inputs_ready()
            torch.cuda._sleep(SLEEP_CYCLES)  # on the thread's stream, before its device-to-device copy
            out.copy_(src)
            order.outputs_written()
        return True

    assert on_thread(write)
    with torch.cuda.stream(side):  # the caller's stream, after the work completed
        assert bool((out == 3.0).all())

