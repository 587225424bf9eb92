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

import os
import resource

_PAGE = os.sysconf("SC_PAGE_SIZE")


class MemoryProbe:
    """`sample()` -> (bytes in use now, peak bytes so far, bytes reserved) for this rank's device
    (reserved: the caching allocator's on CUDA; -1 on CPU, where there is none)."""

    def __init__(self, device: str = "cpu") -> None:
        self.cuda = device.startswith("cuda")
        self._statm = None if self.cuda else os.open("/proc/self/statm", os.O_RDONLY)
        self._peak = 0

    def sample(self) -> tuple[int, int, int]:
        if self.cuda:
            import torch

            return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
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
