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
