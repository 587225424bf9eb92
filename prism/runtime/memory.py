"""What a rank's memory use is, measured honestly.

CUDA: the caching allocator's statistics (`memory_allocated`, `max_memory_allocated`, `memory_reserved`):
exactly the tensor memory the program holds on the device, its peak, and what the allocator holds from
the driver (allocated plus cached blocks). CPU: PyTorch keeps no allocator statistics for host tensors, so
prism records the process's resident set size (RSS, from /proc/self/statm) and its peak (getrusage). RSS
includes the interpreter, torch's libraries and pages shared with the zygote (counted once per process
here), and freed tensor memory that the C allocator has not returned: it bounds the tensor memory from
above and tracks its growth, but is not equal to it.
"""

from __future__ import annotations

import array
import ctypes
import os
import resource

_PAGE = os.sysconf("SC_PAGE_SIZE")
# The C library this process already runs on, by its own symbols: `ctypes.util.find_library` would run
# `ldconfig -p` in a child process, which in the zygote is a fork at start-up that a Ctrl-C can land in
_LIBC = ctypes.CDLL(None)
try:
    _malloc_trim = _LIBC.malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def _allocator_reader(torch):
    """What `torch.cuda.memory_stats_as_nested_dict()` returns, for the current device, without its Python path where
    it is torch's own: that function checks `is_initialized()` and finds the current device through
    `_get_device_index(None, optional=True)` (~20 Python calls, an environment read by `is_available`) before its
    one C call, `torch._C._cuda_memoryStats(device)`; here the device is `torch._C._cuda_getDevice()` (what that path
    ends at) and the initialised check is made until it first holds (CUDA does not become uninitialised). The
    function itself where it is not torch's (a test's fake, a patched torch)."""
    nested = torch.cuda.memory_stats_as_nested_dict
    memory_mod = getattr(torch.cuda, "memory", None)
    stats, device = getattr(torch._C, "_cuda_memoryStats", None), getattr(torch._C, "_cuda_getDevice", None)
    if (stats is None or device is None or memory_mod is None
            or nested is not getattr(memory_mod, "memory_stats_as_nested_dict", None)):
        return nested
    ready = []

    def read() -> dict:
        if not ready:
            if not torch.cuda.is_initialized():
                return {}
            ready.append(True)
        return stats(device())

    return read


class MemoryProbe:
    """`sample()` -> (bytes in use now, peak bytes so far, bytes reserved) for this rank's device
    (reserved: the caching allocator's on CUDA; -1 on CPU, where there is none)."""

    def __init__(self, device: str = "cpu") -> None:
        self.cuda = device.startswith("cuda")
        self._statm = None if self.cuda else os.open("/proc/self/statm", os.O_RDONLY)
        self._peak = 0
        if self.cuda:
            import torch

            self._allocator_stats = _allocator_reader(torch)

    def sample(self) -> tuple[int, int, int]:
        if self.cuda:
            # one read of the allocator's statistics, as torch keeps them (nested): `memory_allocated()` and its
            # siblings each flatten and sort all ~130 of them in Python to return one (3 x ~75 us a marker)
            stats = self._allocator_stats()
            if not stats:  # CUDA not initialised yet: nothing allocated (what memory_allocated() says then)
                return 0, 0, 0
            allocated = stats["allocated_bytes"]["all"]
            return allocated["current"], allocated["peak"], stats["reserved_bytes"]["all"]["current"]
        resident = int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE
        # the kernel's maxrss lags the current RSS by a few pages: the peak is the larger of the two
        self._peak = max(self._peak, resident, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return resident, self._peak, -1


def private_bytes(pid: int | str = "self") -> int:
    """The process's private memory (pages no other process maps: what it costs beyond what it shares
    with the zygote), from /proc/PID/smaps_rollup; 0 where that file cannot be read."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def trim() -> None:
    """Give the C heap's free pages back to the kernel (glibc `malloc_trim`; nothing elsewhere). In a forked
    rank these are mostly pages copied on write from the zygote's heap and then freed."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def fill_heap_holes(limit: int = 16 << 20) -> dict[str, int] | None:
    """In the zygote before it forks: take the free chunks of the C heap (glibc's main arena), so that a
    forked rank's small allocations come from fresh pages at the heap's top instead of the zygote's free
    chunks, where each one would copy the page it lands on (copy-on-write). The chunks are never freed (the
    zygote keeps them for its life; the ranks share them untouched). Returns the bytes and chunks taken and
    the free bytes left below the top (a large chunk no small request split), or None where glibc's
    `mallinfo2` is missing. `limit` bounds what it takes."""
    try:
        info, malloc, sbrk = _LIBC.mallinfo2, _LIBC.malloc, _LIBC.sbrk
    except (OSError, AttributeError):
        return None
    info.restype = _MallInfo2
    malloc.restype = sbrk.restype = ctypes.c_void_p
    malloc.argtypes, sbrk.argtypes = [ctypes.c_size_t], [ctypes.c_ssize_t]
    taken = chunks = 0
    left = None
    for _ in range(3):  # passes while they take something (a split can leave a remainder behind)
        before = info()
        top = (sbrk(0) or 0) - before.keepcost  # where the top chunk starts: every free chunk is below it
        # each small size until the top chunk serves it (its thread cache and bins empty), then ever smaller
        # requests that split what larger free chunks are left
        for size in [*range(24, 1033, 16), 4096 - 24, 1024 - 24, 256 - 24, 64 - 24, 24]:
            while taken < limit:
                p = malloc(size)
                if not p:
                    break
                taken += size
                chunks += 1
                if p >= top:  # from the top chunk: no free chunk of this size is left
                    break
        after = info()
        left = after.fordblks - after.keepcost
        if left == 0 or left >= before.fordblks - before.keepcost:
            break
    return {"bytes": taken, "chunks": chunks, "free_left": left}


def _kind(name: str) -> str:
    if name == "[heap]":
        return "heap"
    if not name:
        return "anon"
    if name.startswith("[stack"):
        return "stack"
    return "file" if name.startswith("/") else name.strip("[]")


def private_by_kind(parent: int | None = None, copied: list[int] | None = None) -> dict[str, dict[str, int]]:
    """Where this process's private memory is, bytes by mapping kind (heap, anon, file, stack, ...):
    `private` from /proc/self/smaps; with `parent` (the zygote's pid) and a readable pagemap (root), also how
    much of it are `copied` pages (written here, present in the parent at the same address: copy-on-write
    of what the zygote shares) and `new` ones (not present in the parent); the copied pages' addresses go
    into `copied` when given (`copied_by_object`). A profiling aid
    (`PRISM_MEMORY_PROFILE`, scripts/rank_memory.py), not run otherwise."""
    out: dict[str, dict[str, int]] = {}
    ranges = []
    kind = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=6)
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                kind = _kind(head[5].strip() if len(head) > 5 else "")
                if "w" in head[1]:
                    ranges.append((lo, hi, kind))
            elif head[0] in ("Private_Clean:", "Private_Dirty:"):
                out.setdefault(kind, {"private": 0, "copied": 0, "new": 0})["private"] += int(head[1]) * 1024
    if parent is None:
        return out
    try:
        mine, theirs = open("/proc/self/pagemap", "rb"), open(f"/proc/{parent}/pagemap", "rb")
    except OSError:
        return out
    present, exclusive, pfn = 1 << 63, 1 << 56, (1 << 55) - 1
    seen_pfn = False  # the kernel shows page frame numbers to CAP_SYS_ADMIN only: else they read 0
    with mine, theirs:
        for lo, hi, kind in ranges:
            n = (hi - lo) // _PAGE
            mine.seek(lo // _PAGE * 8)
            theirs.seek(lo // _PAGE * 8)
            a, b = mine.read(n * 8), theirs.read(n * 8)
            b += bytes(len(a) - len(b))
            if not any(a[i + 7] & 0x80 for i in range(0, len(a), 8)):
                continue
            ours, parents = array.array("Q", a), array.array("Q", b)
            row = out.setdefault(kind, {"private": 0, "copied": 0, "new": 0})
            for i, (x, y) in enumerate(zip(ours, parents)):
                if x & present and x & exclusive:
                    seen_pfn = seen_pfn or bool(x & pfn)
                    if not y & present:
                        row["new"] += _PAGE
                    elif (x & pfn) != (y & pfn):
                        row["copied"] += _PAGE
                        if copied is not None:
                            copied.append(lo + i * _PAGE)
    if not seen_pfn:  # nothing can be told apart without them
        for row in out.values():
            row["copied"] = row["new"] = 0
    return out


def _package(filename: str) -> str:
    """A source file's package, two levels deep (torch/distributed, prism/runtime, the standard library)."""
    parts = filename.replace("\\", "/").split("/")
    for root in ("site-packages", "prism", "lib"):
        if root in parts:
            at = len(parts) - 1 - parts[::-1].index(root)
            tail = parts[at + 1:] if root != "prism" else parts[at:]
            if root == "lib" and tail and tail[0].startswith("python"):
                return "the standard library"
            return "/".join(p.removesuffix(".py") for p in tail[:2])
    return filename


def copied_by_object(pages: list[int]) -> dict[str, int]:
    """Which Python objects the copied pages `pages` (addresses, from `private_by_kind`) hold: bytes by the
    type of the objects on each page (a page with several types counts for each; code objects by their
    size; "no object found" is C memory: malloc's, torch's C++ side, dict and list tables). Every object the
    collector knows (frozen ones included) and the code objects of the functions among them. A profiling aid."""
    import gc
    import sys
    import types

    frozen = gc.get_freeze_count()
    gc.unfreeze()  # (the rank is at its end: the permanent generation's objects become visible)
    try:
        objects = gc.get_objects()
    finally:
        gc.freeze() if frozen else None
    spans = []
    codes = []
    for o in objects:
        try:
            spans.append((id(o), id(o) + sys.getsizeof(o), type(o).__name__))
        except Exception:  # noqa: BLE001 - an object whose size cannot be told is left out
            continue
        if type(o) is types.FunctionType:
            codes.append(o.__code__)
    for c in {id(c): c for c in codes}.values():
        spans.append((id(c), id(c) + sys.getsizeof(c), f"code of {_package(c.co_filename)}"))
    wanted = set(pages)
    on_page: dict[int, set[str]] = {}
    for lo, hi, name in spans:
        for page in range(lo // _PAGE * _PAGE, hi, _PAGE):
            if page in wanted:
                on_page.setdefault(page, set()).add(name)
    out: dict[str, int] = {}
    for page in wanted:
        for name in on_page.get(page, ("no object found",)):
            out[name] = out.get(name, 0) + _PAGE
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
