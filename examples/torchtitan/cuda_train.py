"""torchtitan's trainer on the H200 (torchtitan 0.2.2, torch 2.11), torchtitan's files unchanged.

A wrapper to measure, plus two changes for capture (FSDP2's reduction as SUM, below; a device remap): each rank prints the global average loss torchtitan
logs as a hex float (exact), one line a step ("[cuda_train] rank R step S loss HEX"), and at exit its peak
device memory ("[cuda_train] rank R peak allocated A reserved B", torch.cuda.max_memory_allocated /
max_memory_reserved in bytes). torchtitan picks `cuda:LOCAL_RANK`; W logical ranks on fewer GPUs (prism's
capture: W=4/8 on one GPU) need LOCAL_RANK modulo the GPUs given (CUDA_TRAIN_GPUS, default: no remap).
CUDA_TRAIN_CPU=1 runs the same wrapper on a CPU-only torch (the device probe answers "cpu", torch.cpu gets the
memory calls torchtitan's monitor makes, the groups keep their first timeout): the local check of scripts/frameworks/torchtitan_cuda.sh.

Run: torchrun --nproc-per-node 1 examples/torchtitan/cuda_train.py --model.name llama3 --model.flavor debugmodel ...
"""

import os
import sys

import torch

from titan_patches import cpu_device, fsdp_sum_reduction  # noqa: E402 (beside this file)

_gpus = int(os.environ.get("CUDA_TRAIN_GPUS", "0") or 0)
if _gpus > 0 and "LOCAL_RANK" in os.environ:
    os.environ["LOCAL_RANK"] = str(int(os.environ["LOCAL_RANK"]) % _gpus)

if os.environ.get("CUDA_TRAIN_CPU") == "1":
    cpu_device()

fsdp_sum_reduction()  # capture defines no PREMUL_SUM (titan_patches.py says why)

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
    """One line with the rank's peak device memory (bytes); -1 where no CUDA device was used (CUDA_TRAIN_CPU=1)."""
    on_gpu = torch.cuda.is_initialized()
    allocated = torch.cuda.max_memory_allocated() if on_gpu else -1
    reserved = torch.cuda.max_memory_reserved() if on_gpu else -1
    sys.stdout.write(f"[cuda_train] rank {_RANK} peak allocated {allocated} reserved {reserved}\n")
    sys.stdout.flush()


# at the trainer's close (after the last step; a rank ended by os._exit runs no atexit handler)
_close = torchtitan.train.Trainer.close


def _close_with_peaks(self):
    _peak_memory()
    return _close(self)


torchtitan.train.Trainer.close = _close_with_peaks

if __name__ == "__main__":
    torchtitan.train.main(torchtitan.train.Trainer)  # torchtitan 0.2.2's train.py __main__ block
