"""The CUDA fold kernel is built before an emulated sandbox's program runs (issue 21 item 3): built at the
first fold, its nvcc minute ran inside a collective, and the hang watchdog stopped torchtitan's H200 emulation
in `all_reduce #0`. Here (no GPU) the build is a stand-in that records when it ran."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch._C._distributed_c10d import HashStore

from prism import settings
from prism.runtime.emulate import common_start, fold_cuda
from prism.runtime.emulate import transport as emulate_transport


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(fold_cuda, "_build", lambda: calls.append("build") or "kernel")
    monkeypatch.setattr(fold_cuda, "_module", None)
    return calls


def test_a_cuda_rank_builds_the_kernel_before_its_run(monkeypatch, builds):
    monkeypatch.setenv(settings.DEVICE.name, "cuda")
    fold_cuda.build_before_run()
    fold_cuda.build_before_run()
    assert builds == ["build"] and fold_cuda.module() == "kernel"  # once: later folds load nothing


def test_a_cpu_rank_builds_nothing(monkeypatch, builds):
    monkeypatch.setenv(settings.DEVICE.name, "cpu")
    fold_cuda.build_before_run()
    assert builds == []


def test_a_host_that_cannot_build_is_told_and_the_run_goes_on(monkeypatch, capsys):
    monkeypatch.setenv(settings.DEVICE.name, "cuda")
    monkeypatch.setattr(fold_cuda, "_module", None)

    def fail():
        raise fold_cuda.KernelBuildError("no CUDA toolkit found to build the fold kernel: set CUDA_HOME")

    monkeypatch.setattr(fold_cuda, "_build", fail)
    fold_cuda.build_before_run()
    err = capsys.readouterr().err
    assert "could not be built before the run" in err and "set CUDA_HOME" in err
    with pytest.raises(fold_cuda.KernelBuildError):  # the fold that needs it fails naming the cause
        fold_cuda.module()


def test_the_sandbox_builds_before_the_common_start(monkeypatch):
    order: list[str] = []

    class Started(Exception):
        pass

    def start(*args, **kwargs):
        order.append("common start")
        raise Started

    monkeypatch.setattr(fold_cuda, "build_before_run", lambda: order.append("build"))
    monkeypatch.setattr(common_start, "common_start", start)
    monkeypatch.setattr(emulate_transport, "_T0_NS", [])
    with pytest.raises(Started):
        emulate_transport.for_group(SimpleNamespace(store=HashStore()), "0", [0, 1], None, "nccl", None)
    assert order == ["build", "common start"]
