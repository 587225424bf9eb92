"""Whether async TP (symmetric memory and its fused all-gather/matmul, what torchtitan's
`--parallelism.enable_async_tensor_parallel` and inductor's micro-pipeline TP pass use) runs on a CPU build of
torch over gloo. Plain torch, no prism: it is the precondition for carrying async TP at all.

Run: .venv/bin/torchrun --nproc-per-node 2 scripts/frameworks/async_tp_cpu.py
     (log: docs/results/frameworks/async_tp_cpu.txt)
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

dist.init_process_group("gloo")
group = dist.group.WORLD.group_name
TRIES = [
    ("enable_symm_mem_for_group", lambda: symm_mem.enable_symm_mem_for_group(group)),
    ("symm_mem.empty (a symmetric buffer on cpu)", lambda: symm_mem.empty(16, device="cpu")),
    ("symm_mem::fused_all_gather_matmul", lambda: torch.ops.symm_mem.fused_all_gather_matmul(
        torch.randn(4, 8), [torch.randn(8, 8)], gather_dim=0, group_name=group)),
    ("symm_mem::fused_matmul_reduce_scatter", lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(
        torch.randn(4, 8), torch.randn(8, 8), "sum", scatter_dim=0, group_name=group)),
]
for name, attempt in TRIES:
    try:
        attempt()
        print(f"rank {dist.get_rank()}: {name}: ok", flush=True)
    except Exception as exc:  # noqa: BLE001 - what fails, and how, is the finding
        print(f"rank {dist.get_rank()}: {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
dist.destroy_process_group()
