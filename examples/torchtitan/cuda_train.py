"""torchtitan's trainer on the H200 (torchtitan 0.2.2, torch 2.11), torchtitan's files unchanged.

A wrapper only to measure, plus one remap for capture: each rank prints the global average loss torchtitan
logs as a hex float (exact), one line a step ("[cuda_train] rank R step S loss HEX"), and at exit its peak
device memory ("[cuda_train] rank R peak allocated A reserved B", torch.cuda.max_memory_allocated /
max_memory_reserved in bytes). torchtitan picks `cuda:LOCAL_RANK`; W logical ranks on fewer GPUs (prism's
capture: W=4/8 on one GPU) need LOCAL_RANK modulo the GPUs given (CUDA_TRAIN_GPUS, default: no remap).
CUDA_TRAIN_CPU=1 runs the same wrapper on a CPU-only torch (the device probe answers "cpu", torch.cpu gets the
memory calls torchtitan's monitor makes, the groups keep their first timeout): the local check of scripts/frameworks/torchtitan_cuda.sh.

Run: torchrun --nproc-per-node 1 examples/torchtitan/cuda_train.py --model.name llama3 --model.flavor debugmodel ...
"""

import atexit
import os
import sys
import types

import torch
import torch._utils

_gpus = int(os.environ.get("CUDA_TRAIN_GPUS", "0") or 0)
if _gpus > 0 and "LOCAL_RANK" in os.environ:
    os.environ["LOCAL_RANK"] = str(int(os.environ["LOCAL_RANK"]) % _gpus)

if os.environ.get("CUDA_TRAIN_CPU") == "1":
    torch._utils._get_available_device_type = lambda: "cpu"  # torchtitan reads it once, at import
    _CPU_MEMORY = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {},
    }
    for _name, _fn in _CPU_MEMORY.items():
        if not hasattr(torch.cpu, _name):
            setattr(torch.cpu, _name, _fn)

import torchtitan.train  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402

if os.environ.get("CUDA_TRAIN_CPU") == "1":  # after step 1: a barrier with device_ids ["cpu"], NCCL's argument
    import torchtitan.distributed.utils as _dist_utils

    _dist_utils.set_pg_timeouts = lambda *args, **kwargs: None

_RANK = os.environ.get("RANK", "?")
_log_metrics = MetricsProcessor.log


def _log_with_exact_loss(self, step, global_avg_loss, *args, **kwargs):
    sys.stdout.write(f"[cuda_train] rank {_RANK} step {step} loss {float(global_avg_loss).hex()}\n")  # one write
    sys.stdout.flush()
    return _log_metrics(self, step, global_avg_loss, *args, **kwargs)


MetricsProcessor.log = _log_with_exact_loss


def _peak_memory() -> None:
    if torch.cuda.is_initialized():
        sys.stdout.write(f"[cuda_train] rank {_RANK} peak allocated {torch.cuda.max_memory_allocated()}"
                         f" reserved {torch.cuda.max_memory_reserved()}\n")
        sys.stdout.flush()


atexit.register(_peak_memory)

if __name__ == "__main__":
    torchtitan.train.main(torchtitan.train.Trainer)  # torchtitan 0.2.2's train.py __main__ block
