"""`memory.trim()`: the C heap's free pages go back to the kernel (a capture rank calls it each time it gives its
slot back: pages it copied from the zygote's heap and freed stop counting as its private memory)."""

import multiprocessing as mp

import pytest

from prism.runtime import memory


def _child(queue) -> None:
    # 40 MiB of 8 KiB blocks (below malloc's mmap threshold: they live in the heap), one block kept after
    # them so that the heap's top cannot shrink on its own when they are freed
    blocks = [bytearray(8192) for _ in range(5120)]
    for b in blocks:
        b[::4096] = b"\1" * len(b[::4096])  # touch every page
    keep = bytearray(8192)
    held = memory.private_bytes()
    del blocks
    freed = memory.private_bytes()
    memory.trim()
    trimmed = memory.private_bytes()
    queue.put((held, freed, trimmed, len(keep)))


@pytest.mark.skipif(memory._malloc_trim is None, reason="glibc only (malloc_trim)")
def test_trim_returns_the_freed_heap_pages():
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    held, freed, trimmed, _ = queue.get(timeout=60)
    proc.join(timeout=30)
    mib = 2**20
    # freeing alone keeps most of the 40 MiB resident (free chunks below a live one); trim gives them back
    assert freed - trimmed > 30 * mib, (held / mib, freed / mib, trimmed / mib)


def _writer(shared, queue) -> None:
    import os

    shared[::4096] = b"\2" * len(shared[::4096])  # every page of the parent's buffer: copied on write
    fresh = bytearray(16 << 20)
    fresh[::4096] = b"\3" * len(fresh[::4096])  # pages the parent never had
    queue.put((memory.private_by_kind(os.getppid()), len(fresh)))


def test_private_by_kind_tells_copies_of_the_parents_pages_from_new_ones():
    import os

    shared = bytearray(32 << 20)  # large: its own anonymous mapping, present in the parent
    shared[::4096] = b"\1" * len(shared[::4096])
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_writer, args=(shared, queue))
    proc.start()
    kinds, _ = queue.get(timeout=60)
    proc.join(timeout=30)
    mib = 2**20
    anon = kinds["anon"]
    assert anon["private"] >= 48 * mib, kinds
    if os.geteuid() == 0:  # page frame numbers are shown to root only: without them nothing is classified
        assert 31 * mib <= anon["copied"] <= 40 * mib, kinds
        assert 15 * mib <= anon["new"] <= 24 * mib, kinds
    else:
        assert anon["copied"] == 0 and anon["new"] == 0, kinds  # unknown, not guessed


def test_the_c_library_is_found_without_a_child_process():
    """The zygote imports this module and fills its heap holes at start-up: neither may run a child process
    (`ctypes.util.find_library` runs `ldconfig -p`; a Ctrl-C landing in that fork stopped the zygote before
    its ranks, tests/workflow/test_reproducibility.py). Checked in a fresh interpreter that refuses to spawn."""
    import subprocess
    import sys

    probe = (
        "import os, subprocess\n"
        "def refuse(*a, **k): raise AssertionError('a child process was started')\n"
        "subprocess.Popen.__init__ = refuse; os.fork = refuse; os.posix_spawn = refuse\n"
        "from prism.runtime import memory\n"
        "print(memory._malloc_trim is not None, memory.fill_heap_holes(1 << 20) is not None)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]  # glibc here: both found, through the process's own symbols
