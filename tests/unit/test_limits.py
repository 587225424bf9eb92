"""The machine's limits at large W (`prism.runtime.launch.limits`, `shm.write`), simulated small: each is refused
before anything starts, or stops the job as it happens, with the limit and the fix named."""

from __future__ import annotations

import errno
import os
import resource

import pytest
import torch

from prism.runtime import semantics, shm
from prism.runtime.launch import limits


def _roomy(monkeypatch):
    monkeypatch.setattr(limits, "nofile_limits", lambda: (1024, 1 << 20))
    monkeypatch.setattr(limits, "nproc_limit", lambda: resource.RLIM_INFINITY)
    monkeypatch.setattr(limits, "kernel_limit", lambda name: 4 << 20)
    monkeypatch.setattr(limits, "available_memory", lambda: (125 << 30, 128 << 30))
    monkeypatch.setattr(limits, "shm_free_bytes", lambda folder: 32 << 30)
    monkeypatch.delenv(limits.FORK_BATCH_ENV, raising=False)


def test_a_roomy_machine_passes(monkeypatch):
    _roomy(monkeypatch)
    limits.check_start(8192, "capture", "/dev/shm")


def test_open_files(monkeypatch):
    _roomy(monkeypatch)
    monkeypatch.delenv(limits.OUTPUT_ENV, raising=False)
    monkeypatch.setattr(limits, "nofile_limits", lambda: (1024, 4096))
    limits.check_start(1000, "capture", "/dev/shm")  # 4*1000+64 <= 4096: the zygote raises the soft limit
    # beyond the pipes (4 a rank), the ranks' output goes to files: 2 a rank, which 8192 ranks still exceed
    # (2*8192+64, and while a batch of 64 is forked its control sockets' child ends and the helpers' pipe: 66)
    with pytest.raises(limits.LimitError, match=r"about 16514 open files in prism's supervisor \(2 a rank\).*at most 4096.*ulimit -n 16514"):
        limits.check_start(8192, "capture", "/dev/shm")
    # (real: 2 pipes a rank, 2*8192+64, and a batch's child ends 2*64+2)
    with pytest.raises(limits.LimitError, match=r"about 16578 open files in prism's supervisor \(2 a rank\)"):
        limits.check_start(8192, "real", None)


def test_beyond_the_pipes_a_capture_writes_its_ranks_output_to_files(monkeypatch):
    _roomy(monkeypatch)
    monkeypatch.delenv(limits.OUTPUT_ENV, raising=False)
    monkeypatch.setattr(limits, "nofile_limits", lambda: (1024, 20000))  # the accelerator host's hard limit
    # 4*8192+64 + 3*64+2 (a batch's child ends while a helper forks it); files: 2*8192+64 + 1*64+2
    assert limits.fds_needed(8192, "capture") == 33026 and limits.fds_needed(8192, "capture", "files") == 16514
    assert limits.fds_needed(64, "capture") == 4 * 64 + 64  # one batch: the zygote forks every rank itself
    assert limits.rank_output(4096, "capture") == "pipes"  # 4*4096+64+194 = 16642 fits
    assert limits.rank_output(8192, "capture") == "files"
    assert limits.rank_output(8192, "real") == "pipes"  # (no fallback outside capture: refused instead)
    limits.check_start(8192, "capture", "/dev/shm")  # 2*8192+64+66 <= 20000
    monkeypatch.setenv(limits.OUTPUT_ENV, "files")
    assert limits.rank_output(4, "capture") == "files" and limits.rank_output(4, "slice") == "pipes"
    monkeypatch.setenv(limits.OUTPUT_ENV, "pipes")
    assert limits.rank_output(8192, "capture") == "pipes"


def test_processes(monkeypatch):
    _roomy(monkeypatch)
    monkeypatch.setattr(limits, "nproc_limit", lambda: 4000)
    with pytest.raises(limits.LimitError, match=r"at most 4000 \(`ulimit -u`\).*ulimit -u 8256"):
        limits.check_start(8192, "capture", None)
    monkeypatch.setattr(limits, "nproc_limit", lambda: resource.RLIM_INFINITY)
    monkeypatch.setattr(limits, "kernel_limit", lambda name: 32768 if name == "pid_max" else 20000)
    with pytest.raises(limits.LimitError, match=r"kernel.threads-max is 20000.*sysctl -w kernel.threads-max"):
        limits.check_start(8192, "capture", None)


def test_memory_before_start(monkeypatch):
    _roomy(monkeypatch)
    monkeypatch.setattr(limits, "available_memory", lambda: (20 << 30, 24 << 30))
    limits.check_start(1024, "capture", None)  # 1024 * 15 MiB + 600 MiB = 15.6 GiB
    monkeypatch.setattr(limits, "rank_mib_estimate", lambda: 15)  # no immortal objects (3.11, PRISM_IMMORTAL=0)
    with pytest.raises(limits.LimitError, match=r"needs at least 120.6 GiB \(15 MiB a rank.*only 20.0 GiB of 24.0"):
        limits.check_start(8192, "capture", None)  # 8192 * 15 MiB + 600 MiB
    monkeypatch.setattr(limits, "rank_mib_estimate", lambda: 10)  # immortal objects (3.12+)
    with pytest.raises(limits.LimitError, match=r"needs at least 80.6 GiB \(10 MiB a rank"):
        limits.check_start(8192, "capture", None)  # 8192 * 10 MiB + 600 MiB
    monkeypatch.setattr(limits, "available_memory", lambda: (120 << 30, 125 << 30))  # the accelerator host
    limits.check_start(8192, "capture", None)
    limits.check_start(8192, "real", None)  # only capture holds all W ranks on this machine's memory


def test_rank_memory_estimate_follows_the_interpreter(monkeypatch):
    from prism.runtime.launch import immortal

    monkeypatch.delenv(immortal.ENV, raising=False)
    monkeypatch.setattr(immortal, "unavailable", lambda: None)  # CPython 3.12+, 64-bit
    assert limits.rank_mib_estimate() == limits.RANK_MIB_IMMORTAL == 10
    monkeypatch.setenv(immortal.ENV, "0")
    assert limits.rank_mib_estimate() == limits.RANK_MIB_MORTAL == 14
    monkeypatch.delenv(immortal.ENV)
    monkeypatch.setattr(immortal, "unavailable", lambda: "Python 3.11 has no immortal objects")
    assert limits.rank_mib_estimate() == 14


def test_shm_space_before_start(monkeypatch):
    _roomy(monkeypatch)
    monkeypatch.setattr(limits, "shm_free_bytes", lambda folder: 10 << 20)
    with pytest.raises(limits.LimitError, match=r"/dev/shm has 10 MiB free.*mount -o remount,size="):
        limits.check_start(16, "capture", "/dev/shm")


def test_memory_watch_stops_below_the_floor():
    readings = iter([(8 << 30, 24 << 30), (500 << 20, 24 << 30)])
    watch = limits.MemoryWatch(1024, period_s=1.0, reader=lambda: next(readings))
    assert watch.check(0.0) is None
    assert watch.check(0.5) is None  # not polled again within the period
    msg = watch.check(1.0)
    assert msg is not None and "500 MiB left of 24.0 GiB with 1024 ranks" in msg and "fewer ranks" in msg


def test_full_shm_names_the_limit_and_leaves_no_partial_file(tmp_path, monkeypatch):
    folder = tmp_path / "prism-run"
    folder.mkdir()
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm.os, "write", full)
    with pytest.raises(shm.ShmFull, match=r"is full: a capture moves.*remount,size="):
        shm.write(folder / "c-1-0-r0", shm.encode([torch.ones(4)]))
    monkeypatch.setattr(shm.os, "write", real_write)
    assert list(folder.iterdir()) == []
    shm.write(folder / "c-1-0-r0", shm.encode([torch.ones(4)]))
    assert shm.read(folder / "c-1-0-r0")[1][0].tolist() == [1.0] * 4


@pytest.mark.parametrize("op", [semantics.RedOp.SUM, semantics.RedOp.AVG, semantics.RedOp.MAX])
def test_streamed_fold_is_bitwise_the_reduction(op):
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(257, generator=gen) * 10 ** k for k in range(7)]
    fold = semantics.Fold(op)
    for x in xs:
        fold.add(x)
    assert torch.equal(fold.result(), semantics.reduce(xs, op))
    by_hand = xs[0].clone()
    for x in xs[1:]:
        by_hand = torch.maximum(by_hand, x) if op == semantics.RedOp.MAX else by_hand + x
    if op == semantics.RedOp.AVG:
        by_hand = by_hand / len(xs)
    assert torch.equal(fold.result(), by_hand)
