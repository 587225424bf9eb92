"""Does torch.compile (inductor) with async TP's micro-pipeline pass fuse a CPU program's collectives, and does the
result run? torchtitan's `enable_async_tensor_parallel` sets `torch._inductor.config._micro_pipeline_tp = True` and
calls `enable_symm_mem_for_group` on the TP group; its TP plan with sequence parallelism is this script's MLP
(ColwiseParallel from Shard(1), RowwiseParallel back to Shard(1), DTensor, gloo, CPU tensors).

Each rank compiles the MLP with inductor (a C++ build per graph) and records, through
`torch._inductor.config.post_grad_custom_post_pass` (it runs after the micro-pipeline pass), which collectives and
fused ops each post-grad graph holds; then it runs forward and backward and compares them with the eager DTensor
module. `--gate` makes `torch.distributed.is_nccl_available()` answer True, the pass's first test: it returns at
once on a build without NCCL (this CPU wheel), whatever device the graph's tensors are on. `--no-enable` skips
`enable_symm_mem_for_group`, which torch 2.13 deprecates although the pass's second test,
`is_symm_mem_enabled_for_group`, answers from what that call records.

Run (log: docs/results/frameworks/async_tp_inductor_cpu.txt, by scripts/frameworks/async_tp_inductor_cpu.sh):
    .venv/bin/torchrun --nproc-per-node 2 scripts/frameworks/async_tp_inductor_cpu.py [--gate]
    .venv/bin/prism launch --nproc 2 --mode capture --devices 2 --out OUT scripts/frameworks/async_tp_inductor_cpu.py [--gate]
"""

import argparse
import collections
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--gate", action="store_true", help="answer True to is_nccl_available() (the pass's first test)")
parser.add_argument("--no-enable", action="store_true", help="do not call enable_symm_mem_for_group (deprecated in "
                    "torch 2.13: 'no need to call this function anymore'; the pass's second test reads what it records)")
args = parser.parse_args()
warnings.filterwarnings("ignore", category=FutureWarning)  # enable_symm_mem_for_group is deprecated in 2.13
nccl_built = dist.is_nccl_available()
if args.gate:
    dist.is_nccl_available = lambda: True

import torch._inductor.config as inductor_config  # noqa: E402
import torch.distributed._symmetric_memory as symm_mem  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
if not args.no_enable:
    symm_mem.enable_symm_mem_for_group(mesh.get_group().group_name)
inductor_config._micro_pipeline_tp = True
inductor_config.fx_graph_cache = False  # every run compiles (and so runs the pass)
graphs = []


def observe(graph: torch.fx.Graph) -> None:
    ops = collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
    graphs.append({k: v for k, v in sorted(ops.items()) if "symm_mem" in k or "c10d" in k or k == "aten.mm.default"})


inductor_config.post_grad_custom_post_pass = observe


def say(text: str) -> None:
    print(f"rank {rank}: {text}", flush=True)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 256, bias=False), nn.Linear(256, 64, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


torch.manual_seed(0)
model = MLP()
plan = {"up": ColwiseParallel(input_layouts=Shard(1)), "down": RowwiseParallel(output_layouts=Shard(1))}
parallelize_module(model, mesh, plan)
full = torch.randn(2, 16, 64)
local = full.chunk(world, dim=1)[rank].contiguous()


def step(module):
    """Forward and backward of this rank's sequence shard (the plan wraps it as a DTensor, Shard(1), and returns the
    local output shard): (output, weight gradients, the input's gradient)."""
    x = local.clone().requires_grad_()
    y = module(x)
    y.square().sum().backward()
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    model.zero_grad()
    return y.detach().clone(), grads + [x.grad.clone()]


say(f"torch {torch.__version__}, is_nccl_available() {nccl_built} (gate {'on' if args.gate else 'off'}), "
    f"is_symm_mem_enabled_for_group {symm_mem.is_symm_mem_enabled_for_group(mesh.get_group().group_name)}")
want = step(model)
t0 = time.monotonic()
try:
    got = step(torch.compile(model))
except Exception as exc:  # noqa: BLE001 - how it fails is the finding
    say(f"compiled forward+backward FAILED after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: "
        f"{str(exc).splitlines()[0][:200]}")
    got = None
else:
    diff = max((a - b).abs().max().item() for a, b in zip([want[0], *want[1]], [got[0], *got[1]]))
    say(f"compiled forward+backward ran in {time.monotonic() - t0:.1f} s (compile included); output, weight and "
        f"input gradients vs eager: max abs difference {diff:.3e}")
for i, ops in enumerate(graphs):
    say(f"post-grad graph {i} after the micro-pipeline pass: {dict(ops)}")
fused = sum(v for ops in graphs for k, v in ops.items() if "symm_mem" in k)
say(f"fused symm_mem ops in the compiled graphs: {fused}")
dist.destroy_process_group()
