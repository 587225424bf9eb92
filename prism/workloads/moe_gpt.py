"""Reference workload: train a tiny Qwen3-MoE-style decoder with TP x PP x DP (x EP) in plain torch.distributed.

    python -m prism.workloads.moe_gpt                                   # one process, no torch.distributed
    torchrun --nproc-per-node 8 -m prism.workloads.moe_gpt --tp 2 --pp 2 --dp 2 --ep 2

Rank order is TP fastest, then DP, then PP: rank = tp_idx + tp * (dp_idx + dp * pp_idx) (see parallel.py).

Data rule: step k (from 1) trains on the global samples [(k-1)*B, k*B), B = microbatches * dp * micro-batch-size.
Sample i of the step is sample j of microbatch m on DP rank d where i = m*dp*mbs + d*mbs + j, and each
sample is drawn from its own generator seeded by (seed, global sample index). The loss is a sum over
samples and tokens normalised by global counts, so any layout with the same B -- e.g. --dp 2
--micro-batch-size 2 and --dp 1 --micro-batch-size 4, or --microbatches 4 and --microbatches 1 with 4x the
micro-batch size -- trains on the same batch and prints the same loss up to float rounding.

Printed loss, one line per step from the ranks with tp_idx 0 on the last stage (``step=<k> loss=<v>``):
    mean cross-entropy over all non-padding target tokens of the global batch
    + aux_coef (default 0.01) * load-balancing loss averaged over MoE layers and sequences.
Nothing else goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from .moe_model import ModelConfig, Stage, stage_layers, vocab_parallel_cross_entropy
from .parallel import GradSync, Layout, all_reduce, build_layout, clip_grad_norm, p2p, reduce_tp_partial_grads


class _RankParser(argparse.ArgumentParser):
    """Every rank parses the same arguments: only rank 0 prints what is wrong, all exit 2."""

    def error(self, message: str):
        if int(os.environ.get("RANK", "0")) == 0:
            super().error(message)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _RankParser(prog="moe_gpt", description=__doc__.split("\n")[0])
    add = p.add_argument
    add("--tp", type=int, default=1, help="tensor-parallel size")
    add("--pp", type=int, default=1, help="pipeline stages")
    add("--dp", type=int, default=None, help="data-parallel size (default: WORLD_SIZE / (tp*pp))")
    add("--ep", type=int, default=1, help="expert-parallel size, carved from dp (must divide dp)")
    add("--steps", type=int, default=3)
    add("--microbatches", type=int, default=2)
    add("--micro-batch-size", type=int, default=2)
    add("--seq-len", type=int, default=32)
    add("--hidden", type=int, default=64)
    add("--ffn-hidden", type=int, default=128, help="each expert's FFN width")
    add("--layers", type=int, default=2)
    add("--heads", type=int, default=4)
    add("--kv-heads", type=int, default=2)
    add("--experts", type=int, default=4)
    add("--topk", type=int, default=2)
    add("--vocab", type=int, default=128)
    add("--seed", type=int, default=0)
    add("--var-seq", action="store_true", help="variable sequence lengths, padding masked out of the loss")
    add("--lr", type=float, default=1e-2)
    add("--clip", type=float, default=1.0, help="global gradient-norm clip")
    add("--aux-coef", type=float, default=0.01, help="weight of the load-balancing loss")
    add("--bucket-mb", type=float, default=0.25, help="gradient all-reduce bucket size in MiB")
    add("--backend", default=None, help="default: nccl with CUDA, else gloo")
    add("--device", default="cpu", help="cpu, cuda, or auto (cuda when available); cpu unless asked")
    add("--extra-compute-ms", type=float, default=0.0,
        help="what-if: busy-spin this much thread CPU time after each microbatch's forward on --extra-compute-rank")
    add("--extra-compute-rank", default="", help="comma-separated global ranks that spin (default: none)")
    return p.parse_args(argv)


def layout_error(a: argparse.Namespace, world: int) -> str | None:
    """The first user-fixable layout mistake, as one sentence naming the flag and the fix; None if fine."""
    for flag in ("tp", "pp", "ep", "steps", "microbatches", "micro_batch_size", "seq_len", "hidden",
                 "ffn_hidden", "layers", "heads", "kv_heads", "experts", "topk", "vocab"):
        if getattr(a, flag) < 1:
            return f"--{flag.replace('_', '-')} must be at least 1"
    if a.dp is None:
        if world % (a.tp * a.pp):
            return (f"WORLD_SIZE={world} is not a multiple of --tp {a.tp} x --pp {a.pp}; "
                    f"launch a multiple of {a.tp * a.pp} ranks or change --tp/--pp")
        a.dp = world // (a.tp * a.pp)
    if a.dp < 1 or a.tp * a.pp * a.dp != world:
        return (f"--tp {a.tp} x --pp {a.pp} x --dp {a.dp} = {a.tp * a.pp * a.dp} ranks but WORLD_SIZE={world}; "
                f"launch {a.tp * a.pp * a.dp} ranks or change --tp/--pp/--dp")
    checks = [
        (a.dp % a.ep == 0, f"--ep {a.ep} must divide --dp {a.dp}; pick --ep from the divisors of {a.dp}"),
        (a.experts % a.ep == 0, f"--experts {a.experts} must be divisible by --ep {a.ep}; change --experts or --ep"),
        (a.heads % a.tp == 0, f"--heads {a.heads} must be divisible by --tp {a.tp}; change --heads or --tp"),
        (a.heads % a.kv_heads == 0, f"--heads {a.heads} must be divisible by --kv-heads {a.kv_heads}"),
        (a.hidden % a.heads == 0 and (a.hidden // a.heads) % 2 == 0,
         f"--hidden {a.hidden} must be --heads {a.heads} times an even head size"),
        (a.vocab % a.tp == 0, f"--vocab {a.vocab} must be divisible by --tp {a.tp} (vocab-parallel embedding)"),
        (a.ffn_hidden % a.tp == 0, f"--ffn-hidden {a.ffn_hidden} must be divisible by --tp {a.tp}"),
        (a.topk <= a.experts, f"--topk {a.topk} must not exceed --experts {a.experts}"),
        (a.layers >= a.pp, f"--layers {a.layers} must be at least --pp {a.pp} (one layer per stage)"),
    ]
    return next((msg for ok, msg in checks if not ok), None)


def log(msg: str) -> None:
    """One line to stderr in a single write, so the lines of concurrent ranks never interleave."""
    sys.stderr.write(f"moe_gpt: {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- data

def make_sample(a: argparse.Namespace, gid: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Global sample ``gid``: an arithmetic token sequence with 10% noise; inputs, targets (-1 = pad), length."""
    g = torch.Generator().manual_seed(a.seed * 2**40 + 2**39 + gid)
    S = a.seq_len
    start, stride = torch.randint(a.vocab, (1,), generator=g), torch.randint(1, 8, (1,), generator=g)
    tokens = (start + stride * torch.arange(S + 1)) % a.vocab
    noise = torch.rand(S + 1, generator=g) < 0.1
    tokens = torch.where(noise, torch.randint(a.vocab, (S + 1,), generator=g), tokens)
    length = int(torch.randint(max(1, S // 4), S + 1, (1,), generator=g)) if a.var_seq else S
    inputs, targets = tokens[:S].clone(), tokens[1:].clone()
    inputs[length:], targets[length:] = 0, -1
    return inputs, targets, length


def local_batch(a: argparse.Namespace, lay: Layout, step: int, device) -> list[tuple[torch.Tensor, ...]]:
    """This DP rank's microbatches for ``step``: (inputs [b,S], targets [b,S], valid [b,S]) each."""
    B, mbs = a.microbatches * a.dp * a.micro_batch_size, a.micro_batch_size
    out = []
    for m in range(a.microbatches):
        samples = [make_sample(a, (step - 1) * B + m * a.dp * mbs + lay.dp_idx * mbs + j) for j in range(mbs)]
        inputs = torch.stack([s[0] for s in samples])
        targets = torch.stack([s[1] for s in samples])
        valid = torch.arange(a.seq_len) < torch.tensor([s[2] for s in samples]).unsqueeze(1)
        out.append((inputs.to(device), targets.to(device), valid.to(device)))
    return out


def spin(ns: int) -> None:
    """Busy-spin `ns` of this thread's CPU time (a what-if's extra compute: CPU time grows, unlike a sleep).

    The thread clock is a system call (which can flush the TLB and slow what runs next), so it is read once
    per ~0.2 ms of spinning on the vDSO wall clock."""
    end = time.thread_time_ns() + ns
    while (now := time.thread_time_ns()) < end:
        stop = time.perf_counter_ns() + min(end - now, 200_000)
        while time.perf_counter_ns() < stop:
            pass


# ---------------------------------------------------------------- one training step: 1F1B over microbatches

def train_step(a, model: Stage, lay: Layout, sync: GradSync, batch, device) -> torch.Tensor:
    """Forward and backward of every microbatch in 1F1B order; returns this rank's share of the loss."""
    M, dp = a.microbatches, a.dp
    B = M * dp * a.micro_batch_size
    shape = torch.Size((a.micro_batch_size, a.seq_len, a.hidden))
    n_tokens = None
    if lay.last_stage:   # global count of target tokens normalises the cross-entropy
        local = sum(int((t >= 0).sum()) for _, t, _ in batch)
        n_tokens = all_reduce(torch.tensor([float(local)], device=device), lay.dp_group)
    report = torch.zeros((), device=device)
    done = {"fwd": 0, "bwd": 0}
    spinning = str(lay.rank) in a.extra_compute_rank.split(",")
    spin_ns = int(a.extra_compute_ms * 1e6) if spinning else 0
    queue: list[tuple] = []

    def forward(x):
        nonlocal report
        inputs, targets, valid = batch[done["fwd"]]
        done["fwd"] += 1
        if lay.first_stage:
            x = inputs
        out, aux = model(x, valid)
        # scaled by dp so that averaging gradients (and losses) over DP gives the global-batch objective
        objective = a.aux_coef * dp * aux.sum() / (B * a.layers)
        if lay.last_stage:
            ce = vocab_parallel_cross_entropy(out.flatten(0, 1), targets.flatten(), lay)
            objective = objective + dp * ce.sum() / n_tokens[0]
            out = None
        report = report + objective.detach()
        if spin_ns:
            spin(spin_ns)
        return x, out, objective

    def backward(x, out, objective, grad):
        if done["bwd"] == M - 1:
            sync.arm()   # the last microbatch completes the gradients: bucket all-reduces start now
        done["bwd"] += 1
        tensors, grads = [objective], [torch.ones_like(objective)]
        if out is not None:
            tensors.append(out)
            grads.append(grad)
        torch.autograd.backward(tensors, grads)
        return None if lay.first_stage else x.grad

    def recv_forward():
        if lay.first_stage:
            return None
        return p2p(lay, device, recv_prev=shape)[0].requires_grad_()

    def send_forward(out):
        if not lay.last_stage:
            p2p(lay, device, send_next=out.detach())

    def send_forward_recv_backward(out):
        if lay.last_stage:
            return None
        return p2p(lay, device, send_next=out.detach(), recv_next=shape)[1]

    def send_backward(grad):
        if not lay.first_stage:
            p2p(lay, device, send_prev=grad)

    def send_backward_recv_forward(grad):
        if lay.first_stage:
            return None
        return p2p(lay, device, send_prev=grad, recv_prev=shape)[0].requires_grad_()

    warmup = min(lay.pp - lay.pp_idx - 1, M)
    remaining = M - warmup
    for _ in range(warmup):
        x, out, obj = forward(recv_forward())
        send_forward(out)
        queue.append((x, out, obj))
    x = recv_forward() if remaining else None
    for i in range(remaining):
        x, out, obj = forward(x)
        grad = send_forward_recv_backward(out)
        queue.append((x, out, obj))
        grad_in = backward(*queue.pop(0), grad)
        if i == remaining - 1:
            send_backward(grad_in)
        else:
            x = send_backward_recv_forward(grad_in)
    for _ in range(warmup):
        x, out, obj = queue.pop(0)
        grad = p2p(lay, device, recv_next=shape)[1] if not lay.last_stage else None
        send_backward(backward(x, out, obj, grad))
    return report


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None, between_steps=None) -> None:
    """Train; `between_steps(k)`, if given, is called before step k (from 1) and once after the last step
    (k = steps + 1), outside any step (`prism bench overhead --interleave` times and toggles there)."""
    a = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1"))
    error = layout_error(a, world)
    if error:
        if int(os.environ.get("RANK", "0")) == 0:
            log(f"error: {error}")
        sys.exit(2)

    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        if int(os.environ.get("RANK", "0")) == 0:
            log(f"error: --device cuda, but no CUDA device is usable here (torch {torch.__version__}, "
                f"torch.cuda.is_available() is False): run on a GPU host or use --device cpu")
        sys.exit(2)
    if use_cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        # the math attention kernels are the deterministic ones (memory-efficient backward uses atomics)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        device = torch.device("cpu")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if distributed:
        dist.init_process_group(backend=a.backend or ("nccl" if use_cuda else "gloo"))
    lay = build_layout(a.tp, a.pp, a.dp, a.ep)
    if lay.pp > 1:   # a first collective on the pp group, before any batched p2p (NCCL requires it)
        all_reduce(torch.zeros(1, device=device), lay.pp_group)

    cfg = ModelConfig(vocab=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                      experts=a.experts, topk=a.topk, ffn_hidden=a.ffn_hidden, seq_len=a.seq_len, seed=a.seed)
    model = Stage(cfg, lay).to(device)
    params = list(model.parameters())
    experts = [p for p in params if getattr(p, "expert", False)]
    dense = [p for p in params if not getattr(p, "expert", False)]
    sync = GradSync([(dense, lay.dp_group), (experts, lay.edp_group)], a.dp, int(a.bucket_mb * 2**20))
    tp_partial = [p for p in params if getattr(p, "tp_partial", False)]
    dense_sharded = [p for p in dense if getattr(p, "tp_sharded", False)]
    dense_replicated = [p for p in dense if not getattr(p, "tp_sharded", False)]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    log(f"rank {lay.rank} tp {lay.tp_idx}/{lay.tp} dp {lay.dp_idx}/{lay.dp} pp {lay.pp_idx}/{lay.pp} "
        f"ep {lay.ep_idx}/{lay.ep} layers {list(stage_layers(a.layers, lay.pp, lay.pp_idx))} "
        f"buckets {len(sync.buckets)}")

    for step in range(1, a.steps + 1):
        if between_steps is not None:
            between_steps(step)
        report = train_step(a, model, lay, sync, local_batch(a, lay, step, device), device)
        sync.finish()
        reduce_tp_partial_grads(tp_partial, lay)
        norm = clip_grad_norm(dense_sharded, dense_replicated, experts, lay, a.clip, device)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = all_reduce(all_reduce(report, lay.pp_group), lay.dp_group) / lay.dp
        if lay.last_stage and lay.tp_idx == 0:
            sys.stdout.write(f"step={step} loss={loss.item():.8f}\n")   # one write: ranks' lines never interleave
            sys.stdout.flush()
            log(f"step={step} grad_norm={norm.item():.10f}")
    if between_steps is not None:
        between_steps(a.steps + 1)

    if distributed:
        dist.destroy_process_group()


def prism_warmup(argv: list[str]) -> None:
    """Called once by prism's zygote before it forks the ranks (`prism launch --preload
    prism.workloads.moe_gpt`): one step of the same model in one process (no torch.distributed, every group
    None), so that the lazy initialisations of a first step (torch's op caches, the interpreter's
    specialised bytecode, the model code's objects) are paid once and shared by every rank copy-on-write,
    instead of once per rank. Leaves no trace: output discarded, RNG and determinism settings restored."""
    import contextlib
    import io

    state = (torch.get_rng_state(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads())
    world = os.environ.pop("WORLD_SIZE", None)
    one = ["--tp", "1", "--pp", "1", "--dp", "1", "--ep", "1", "--steps", "1", "--device", "cpu"]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(list(argv) + one)
    except SystemExit:
        pass  # arguments the ranks will reject (and say why)
    finally:
        if world is not None:
            os.environ["WORLD_SIZE"] = world
        torch.set_rng_state(state[0])
        torch.use_deterministic_algorithms(state[1], warn_only=state[2])
        torch.set_num_threads(state[3])


if __name__ == "__main__":
    main()
