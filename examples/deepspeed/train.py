"""A small DeepSpeed training job on CPU (gloo): what `deepspeed`/torchrun runs, unmodified under prism.

--engine zero   deepspeed.initialize with ZeRO stage --zero-stage (1 or 2): DeepSpeed's own optimizer wrapper
                (DeepSpeedZeroOptimizer: partitioned optimizer state, its own gradient buckets and
                reduce-scatter/all-reduce, gradient accumulation of --accum microbatches, fp32 on CPU)
--engine pipe   deepspeed.pipe.PipelineModule over --pp stages (data parallel over the rest of the ranks):
                DeepSpeed's own pipeline schedule (TrainSchedule: 1F1B over --accum microbatches, its p2p
                activations and gradients), engine.train_batch

Prints `step N rank R loss L` on every rank that has a loss (zero: every rank, its own microbatches; pipe:
the last stage's ranks), with fixed seeds: deterministic, compared across torchrun and prism's modes. No prism
import, no CUDA.
Run: torchrun --nproc-per-node 2 examples/deepspeed/train.py --engine zero --zero-stage 2
"""

import argparse
import os

import deepspeed
import torch
import torch.nn as nn
from deepspeed.pipe import PipelineModule

DIM, LAYERS, MICRO = 32, 4, 4


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write: two ranks' lines never interleave on a shared pipe


def layers() -> list[nn.Module]:
    out = []
    for _ in range(LAYERS):
        out += [nn.Linear(DIM, DIM), nn.Tanh()]
    return out + [nn.Linear(DIM, 4)]


def batches(rank: int, n: int):
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(n):
        yield torch.randn(MICRO, DIM, generator=gen), torch.randn(MICRO, 4, generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["zero", "pipe"], default="zero")
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accum", type=int, default=2)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": args.accum,
              "steps_per_print": 10**9, "wall_clock_breakdown": False,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    loss_fn = nn.MSELoss()
    if args.engine == "zero":
        config["zero_optimization"] = {"stage": args.zero_stage, "reduce_bucket_size": 2000,
                                       "allgather_bucket_size": 2000}
        model = nn.Sequential(*layers())
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        data = batches(rank, args.steps * args.accum)
        for step in range(args.steps):
            total = 0.0
            for _ in range(args.accum):
                x, y = next(data)
                loss = loss_fn(engine(x), y)
                engine.backward(loss)
                engine.step()  # steps the optimizer only at the accumulation boundary
                total += loss.item() / args.accum
            say(f"step {step} rank {rank} loss {total:.10e}")
    else:
        model = PipelineModule(layers=layers(), num_stages=args.pp, loss_fn=loss_fn,
                               partition_method="uniform", activation_checkpoint_interval=0)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        dp_rank = engine.grid.get_data_parallel_rank()
        data = batches(dp_rank, args.steps * args.accum)
        for step in range(args.steps):
            loss = engine.train_batch(data_iter=data)
            if engine.is_last_stage():
                say(f"step {step} rank {rank} loss {loss.item():.10e}")
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
