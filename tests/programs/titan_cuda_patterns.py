"""torchtitan 0.2.2's CUDA training step in public torch APIs (issue 21 item 3: its slices and emulation hang
on CUDA while the reference workload's pass): the patterns the reference workload lacks.

- the default group made the way torchtitan makes it: `init_process_group("nccl")` on CUDA (the reference
  workload's CUDA tests ask for gloo), optionally with `device_id` (`--device-id`: eager init, bound device),
  after `torch.cuda.set_device(cuda:LOCAL_RANK mod --gpus)` (W logical ranks sharing the GPUs);
- a 1-D DeviceMesh over the world (its group is the default group, as torchtitan's "batch"/"fsdp" meshes);
- torchtitan's first collective of a step: the valid-token count, an int64 scalar made on the host, moved
  to the device and summed with a *functional* all-reduce (`funcol.all_reduce(...).item()`);
- a 2-block FSDP2 model (`fully_shard` per block + root, reshard after forward), AdamW, gradient clipping over
  DTensor gradients, and the global loss reduced with `funcol.all_reduce(loss, "sum", mesh)`.

Prints one `result loss R STEP HEX` line per rank and step (the global loss as an exact hex float) and
`result done R`. Runs on CPU too (`--device cpu`: gloo; the backend asked for stays --backend).

Run: torchrun --nproc-per-node 4 tests/programs/titan_cuda_patterns.py --device cuda --gpus 1
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdp2 import Block  # beside this file: fsdp2.py's residual MLP block


def emit(*words) -> None:
    """One `result` line, one write (concurrent ranks never interleave)."""
    os.write(1, ("result " + " ".join(map(str, words)) + "\n").encode())


class Model(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--backend", default=None, help="what init_process_group asks for (default: nccl on cuda, "
                                                    "gloo on cpu; e.g. 'cuda:nccl,cpu:gloo')")
    ap.add_argument("--device-id", action="store_true", help="init_process_group(device_id=the rank's device)")
    ap.add_argument("--gpus", type=int, default=0, help="LOCAL_RANK modulo this many GPUs (0: no remap)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-fsdp", action="store_true", help="only the int64 functional all-reduce and the loss")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.gpus > 0:
        local %= args.gpus
    if args.device == "cuda":
        device = torch.device(f"cuda:{local}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    dist.init_process_group(backend=backend, **({"device_id": device} if args.device_id else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    torch.manual_seed(0)
    model = Model().to(device)
    if not args.no_fsdp:
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, 64, (2, 16), generator=gen)
        labels = torch.randint(0, 64, (2, 16), generator=gen)
        labels[0, :3] = -100  # ignored positions, as torchtitan's IGNORE_INDEX
        valid = torch.tensor(0, dtype=torch.int64)
        valid += (labels != -100).sum()
        valid = valid.to(device)
        global_valid = funcol.all_reduce(valid, "sum", mesh)  # torchtitan's dist_sum: int64, functional
        global_valid = torch.tensor(global_valid.item(), dtype=torch.float32, device=device)
        logits = model(tokens.to(device))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.to(device).flatten(),
                                           reduction="sum", ignore_index=-100) / global_valid
        loss.backward()
        if not args.no_fsdp:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        opt.zero_grad()
        total = funcol.all_reduce(loss.detach(), "sum", mesh).item()
        emit("loss", rank, step, float(total).hex())
    emit("done", rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
