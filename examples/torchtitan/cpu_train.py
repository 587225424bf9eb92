"""torchtitan's trainer on a CPU-only torch, torchtitan's files unchanged.

torchtitan 0.3.0 assumes an accelerator: `torchtitan.tools.utils` takes the device type from
`torch._utils._get_available_device_type() or "cuda"` (None on a CPU-only torch, so "cuda", and
`torch.cuda.set_device` fails), and its memory monitor calls CUDA's memory API on that device module.
This wrapper makes the probe answer "cpu" before torchtitan is imported, gives `torch.cpu` the memory
calls it lacks (answering "unknown"),
then runs `torchtitan.train.main()` with the command line it was given; the rest of each run (its
torchtitan options) is in scripts/frameworks/torchtitan_cpu.sh. It touches nothing of prism: run it under
torchrun or `prism launch` alike.

Run: torchrun --nproc-per-node 2 examples/torchtitan/cpu_train.py --module llama3 --config llama3_debugmodel ...
"""

import os
import types

import torch
import torch._utils

torch._utils._get_available_device_type = lambda: "cpu"  # torchtitan reads it once, at import

# torchtitan's memory monitor asks the device module for CUDA's memory API; torch.cpu has none of it.
_CPU_MEMORY = {
    "get_device_name": lambda device=None: "cpu",
    "get_device_properties": lambda device=None: types.SimpleNamespace(
        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
    "reset_peak_memory_stats": lambda device=None: None,
    "empty_cache": lambda: None,
    "memory_stats": lambda device=None: {},  # torchtitan then logs -1 for the peaks
}
for _name, _fn in _CPU_MEMORY.items():
    if not hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, _fn)

import torchtitan.train  # noqa: E402  (after the probe is answered)

if __name__ == "__main__":
    torchtitan.train.main()
