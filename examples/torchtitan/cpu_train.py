"""torchtitan's trainer on a CPU-only torch, torchtitan's files unchanged.

torchtitan 0.3.0 assumes an accelerator: `torchtitan.tools.utils` takes the device type from
`torch._utils._get_available_device_type() or "cuda"` (None on a CPU-only torch, so "cuda", and
`torch.cuda.set_device` fails), and its memory monitor calls CUDA's memory API on that device module.
This wrapper makes the probe answer "cpu" before torchtitan is imported, gives `torch.cpu` the memory
calls it lacks (answering "unknown"), runs FlexAttention eagerly and lets its backward run on CPU, makes FSDP2 reduce gradients by SUM
rather than NCCL's PREMUL_SUM, keeps the groups' first timeout (no NCCL-only barrier),
lets torch 2.13.0's pipeline schedules take torchtitan's pre-split microbatches,
prints each step's logged loss exactly (a hex float), pins the rank to a core when asked (CPU_TRAIN_PIN=1),
then runs `torchtitan.train.main()` with the command line it was given; the rest of each run (its
torchtitan options) is in scripts/frameworks/torchtitan_cpu.sh. It touches nothing of prism: run it under
torchrun or `prism launch` alike.

Run: torchrun --nproc-per-node 2 examples/torchtitan/cpu_train.py --module llama3 --config llama3_debugmodel ...
"""

import os
import sys
import time

# (session 15; opt-in, off by default) CPU_TRAIN_PIN=1: this rank on one core, chosen by LOCAL_RANK, with one torch
# intra-op thread: the layout of prism's pinned runs (prism/runtime/launch/forked_rank.py: rank i on the i-th claimed
# core, `torch.set_num_threads(1)`), so that torchrun's wall time per step is the truth a prediction of one rank per
# core describes (scripts/frameworks/torchtitan_timing.sh sets it). CPU_TRAIN_PIN_CORES=0,1: the cores in local-rank
# order (default: this process's affinity, lowest first). Set before torch is imported: every thread torch and gloo
# start later inherits the core. A placement, no change to the math.
_PINNED = None
if os.environ.get("CPU_TRAIN_PIN") == "1":
    _cores = ([int(c) for c in os.environ["CPU_TRAIN_PIN_CORES"].split(",")] if os.environ.get("CPU_TRAIN_PIN_CORES")
              else sorted(os.sched_getaffinity(0)))
    _PINNED = _cores[int(os.environ.get("LOCAL_RANK", "0")) % len(_cores)]
    for _tid in os.listdir("/proc/self/task"):  # the interpreter's threads so far (one, normally)
        os.sched_setaffinity(int(_tid), {_PINNED})

from titan_patches import cpu_device, fsdp_sum_reduction  # noqa: E402 (beside this file)

import torch  # noqa: E402

if _PINNED is not None:
    torch.set_num_threads(1)

cpu_device()

# torch refuses FlexAttention's backward on CPU before it starts (an eager check; the dense math
# implementation of the backward it would run exists): torchtitan's language models only offer flex / varlen
# / flash attention. Skipping that one check runs the eager (math) backward on CPU: slow, exact.
import torch.nn.attention.flex_attention as _flex  # noqa: E402

_check_device = _flex._validate_device


def _validate_device_but_cpu_backward(query, key, value):
    if query.device.type != "cpu":
        _check_device(query, key, value)


_flex._validate_device = _validate_device_but_cpu_backward

fsdp_sum_reduction()  # gloo refuses FSDP2's PREMUL_SUM (titan_patches.py says why)

import torchtitan.train  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402

# torchtitan runs FlexAttention through torch.compile (inductor), which has no CPU path for it here: the
# eager FlexAttention instead (the same math, not fused).
FlexAttention._compiled_flex_attn = _flex.flex_attention

# After the first step torchtitan shortens every group's timeout: a barrier with device_ids (NCCL's
# argument; gloo's BarrierOptions take integers, torch.cpu.current_device() is "cpu") and
# dist.set_timeout. On CPU the groups keep the timeout they were created with.
import torchtitan.distributed.utils as _dist_utils  # noqa: E402

_dist_utils.set_pg_timeouts = lambda *args, **kwargs: None

# torchtitan 0.3.0's pipeline step calls `schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=..., losses=...)`:
# microbatches it split itself, an API of a torch newer than 2.13.0, whose `step(*args, target=, **kwargs)` takes
# the whole batch and splits it (the three lists land in **kwargs, as model inputs: "Expecting 2 arg_mbs but got
# 1" on every rank, any device, with or without prism). Not CPU-specific: a version mismatch. With pre-split
# microbatches, this `step` does what torch 2.13.0's does after its own split: the stages' flags, their
# per-step reset, `_step_microbatches` with the lists as given. CPU_TRAIN_NO_PP_ADAPTER=1 leaves torch's
# `step` alone (to show the failure: scripts/frameworks/torchtitan_pp_torch_api.sh).
from torch.distributed.pipelining import schedules as _schedules  # noqa: E402


def _step_with_microbatches(torch_step):
    def step(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
             loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return torch_step(self, *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs,
                              **kwargs)
        if args or kwargs or return_outputs:
            raise TypeError("cpu_train's pipeline step adapter: microbatch lists only, return_outputs=False")
        stages = getattr(self, "_stages", None) or [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, False, loss_kwargs=loss_kwargs)
        return None

    return step


if os.environ.get("CPU_TRAIN_NO_PP_ADAPTER") != "1":
    for _cls in (_schedules.PipelineScheduleSingle, _schedules.PipelineScheduleMulti):
        _cls.step = _step_with_microbatches(_cls.step)

# torchtitan logs its loss with 5 decimals; "equal" between runs needs the float itself. Each rank also prints
# the global average loss it logs as a hex float (exact), one line a step, with the clocks read there: wall
# (perf_counter), the main thread's CPU time (thread_time: the thread torchtitan computes on) and the process's
# (process_time: gloo's threads included) and the main thread's run delay (time runnable but waiting for a core,
# /proc/thread-self/schedstat: what a box shared with other jobs costs it), so a step's wall time, CPU time and
# run delay are the differences of two lines.
# A print: no change to the math.
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402

_log_metrics = MetricsProcessor.log


def _run_delay_s() -> float:
    """The main thread's time runnable but not running (waiting for a core: the kernel's schedstat), -1 if unknown."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return -1.0


def _affinities() -> str:
    """Every thread of this process and the cores it may run on, e.g. "7 threads on [0]" (the pin, checked)."""
    cores = set()
    tids = os.listdir("/proc/self/task")
    for tid in tids:
        try:
            cores |= os.sched_getaffinity(int(tid))
        except OSError:  # a thread that ended meanwhile
            pass
    return f"{len(tids)} threads on {sorted(cores)}"


def _log_with_exact_loss(self, step, global_avg_loss, *args, **kwargs):
    if _PINNED is not None and step == 1:  # the pin, checked once every thread (gloo's too) has started
        sys.stdout.write(f"[cpu_train] rank {os.environ.get('RANK', '?')} pinned to core {_PINNED}, torch threads "
                         f"{torch.get_num_threads()}: {_affinities()}\n")
    # one write (print writes the text and the newline apart: ranks sharing a stdout interleave them)
    sys.stdout.write(f"[cpu_train] rank {os.environ.get('RANK', '?')} step {step} loss {float(global_avg_loss).hex()}"
                     f" wall {time.perf_counter():.6f} cpu {time.thread_time():.6f} proc {time.process_time():.6f}"
                     f" delay {_run_delay_s():.6f}\n")
    sys.stdout.flush()
    return _log_metrics(self, step, global_avg_loss, *args, **kwargs)


MetricsProcessor.log = _log_with_exact_loss

if __name__ == "__main__":
    torchtitan.train.main()
