"""What torchtitan needs from a wrapper here, shared by cpu_train.py (torchtitan 0.3.0, CPU) and cuda_train.py
(torchtitan 0.2.2, the H200; its CPU check). None of it is prism's: it changes no torchtitan file, and runs
under torchrun and `prism launch` alike. Each function is called before torchtitan is imported."""

import os
import types

import torch
import torch._utils


def cpu_device() -> None:
    """torchtitan takes the device type once, at import, and asks the device module for CUDA's memory API,
    which torch.cpu lacks: "cpu", and that API as no-ops (torchtitan then logs -1 for the peaks)."""
    torch._utils._get_available_device_type = lambda: "cpu"
    memory = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {},
    }
    for name, fn in memory.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def fsdp_sum_reduction() -> None:
    """torchtitan sets FSDP2's gradient divide factor to 1.0, which FSDP2 turns into a PREMUL_SUM
    reduce-scatter (NCCL's): gloo refuses it, and prism's capture, which computes collectives itself, defines
    none (it stops the job naming this fix). FSDP2's own switch to plain SUM gives the same gradients (a
    factor of 1.0: no division), in every run alike, the truth included."""
    from torch.distributed.fsdp import FSDPModule

    set_factor = FSDPModule.set_gradient_divide_factor

    def set_factor_with_sum(self, factor: float) -> None:
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_factor_with_sum
