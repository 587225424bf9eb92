"""The parallelism of the reference workload, in a few named helpers (plain torch.distributed).

Rank order: TP fastest, then DP, then PP::

    rank = tp_idx + tp * (dp_idx + dp * pp_idx)

Groups, created by every rank in this order, each with ``group_desc`` set:

- ``tp``  -- same (pp, dp), all tp indices: column/row-parallel linears, vocab-parallel embedding and loss.
- ``dp``  -- same (pp, tp), all dp indices: all-reduce of the dense (non-expert) gradients.
- ``pp``  -- same (dp, tp), all pp indices: activations and gradients by point-to-point send/recv.
- ``ep``  -- same (pp, tp), ``ep`` consecutive dp indices: expert dispatch/combine by all_to_all_single.
- ``edp`` -- same (pp, tp), dp indices with the same index inside their ep group: all-reduce of the
  expert gradients (each expert lives on one rank of every ep group).

With one process and no ``WORLD_SIZE`` the workload never initialises torch.distributed: every group is
``None`` and every helper here is then the identity.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

Group = dist.ProcessGroup | None


@dataclass
class Layout:
    """This rank's coordinates and the groups it belongs to."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    rank: int = 0
    tp_idx: int = 0
    dp_idx: int = 0
    pp_idx: int = 0
    tp_group: Group = None
    dp_group: Group = None
    pp_group: Group = None
    ep_group: Group = None
    edp_group: Group = None

    @property
    def ep_idx(self) -> int:
        return self.dp_idx % self.ep

    @property
    def first_stage(self) -> bool:
        return self.pp_idx == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_idx == self.pp - 1

    def global_rank(self, tp_idx: int, dp_idx: int, pp_idx: int) -> int:
        return tp_idx + self.tp * (dp_idx + self.dp * pp_idx)


def build_layout(tp: int, pp: int, dp: int, ep: int) -> Layout:
    """Every rank creates every group in the same order and keeps the ones that contain it.

    One kind of group at a time, as Megatron's `initialize_model_parallel` does (its `RankGenerator.get_ranks`
    lists one kind's groups): a rank then holds one kind's rank lists at once, not every kind's (at W=8192,
    tp2·pp2·dp2048·ep2, 12,300 lists and ~41,000 int objects, ~3.7 MiB of Python objects at their peak, which
    the interpreter keeps resident after they are freed: the rank's few surviving groups sit among them)."""
    if not dist.is_initialized():
        return Layout()
    rank = dist.get_rank()
    lay = Layout(tp=tp, pp=pp, dp=dp, ep=ep, rank=rank,
                 tp_idx=rank % tp, dp_idx=(rank // tp) % dp, pp_idx=rank // (tp * dp))
    g = lay.global_rank
    kinds = (
        ("tp", lambda: [[g(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)]),
        ("dp", lambda: [[g(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)]),
        ("pp", lambda: [[g(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)]),
        ("ep", lambda: [[g(t, b * ep + e, p) for e in range(ep)]
                        for p in range(pp) for t in range(tp) for b in range(dp // ep)]),
        ("edp", lambda: [[g(t, b * ep + e, p) for b in range(dp // ep)]
                         for p in range(pp) for t in range(tp) for e in range(ep)]),
    )
    for name, groups in kinds:
        for ranks in groups():
            group = dist.new_group(ranks, group_desc=name)
            if rank in ranks:
                setattr(lay, f"{name}_group", group)
    return lay


def group_size(group: Group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def all_reduce(t: torch.Tensor, group: Group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce; the identity for a one-rank group."""
    if group_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


# ---------------------------------------------------------------- autograd-aware communication (Megatron f/g)

class _CopyToGroup(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce the gradient (each TP rank saw part of the consumers)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.clone(), ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    """Forward: all-reduce the partial sums. Backward: identity (the sum's gradient is replicated)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; the backward sends the gradients back the way they came."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return _CopyToGroup.apply(x, group) if group_size(group) > 1 else x


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, group) if group_size(group) > 1 else x


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Group) -> torch.Tensor:
    return _AllToAll.apply(x, out_splits, in_splits, group) if group_size(group) > 1 else x


def exchange_counts(counts: torch.Tensor, group: Group) -> torch.Tensor:
    """Tell every EP peer how many tokens it will receive: an all_to_all_single of equal-sized count blocks."""
    if group_size(group) == 1:
        return counts
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts, group=group)
    return out


# ---------------------------------------------------------------- pipeline point-to-point

def p2p(lay: Layout, device: torch.device, send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None, recv_prev: torch.Size | None = None,
        recv_next: torch.Size | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One batch of isend/irecv to the neighbouring stages; returns (from_prev, from_next) on ``device``."""
    # gloo's send/recv take host memory only: CUDA tensors go through a host copy
    wire = torch.device("cpu") if dist.get_backend(lay.pp_group) == "gloo" else device
    ops, from_prev, from_next = [], None, None
    prev_rank = lay.global_rank(lay.tp_idx, lay.dp_idx, lay.pp_idx - 1)
    next_rank = lay.global_rank(lay.tp_idx, lay.dp_idx, lay.pp_idx + 1)
    if send_next is not None:
        ops.append(dist.P2POp(dist.isend, send_next.to(wire).contiguous(), next_rank, lay.pp_group))
    if send_prev is not None:
        ops.append(dist.P2POp(dist.isend, send_prev.to(wire).contiguous(), prev_rank, lay.pp_group))
    if recv_prev is not None:
        from_prev = torch.empty(recv_prev, device=wire)
        ops.append(dist.P2POp(dist.irecv, from_prev, prev_rank, lay.pp_group))
    if recv_next is not None:
        from_next = torch.empty(recv_next, device=wire)
        ops.append(dist.P2POp(dist.irecv, from_next, next_rank, lay.pp_group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return (None if from_prev is None else from_prev.to(device),
            None if from_next is None else from_next.to(device))


# ---------------------------------------------------------------- data-parallel gradient all-reduce

class _Bucket:
    def __init__(self, params: list[nn.Parameter], group: Group):
        self.params, self.group = params, group
        self.ready, self.flat, self.work = 0, None, None


class GradSync:
    """Bucketed gradient all-reduce, launched from per-parameter hooks so it overlaps the backward.

    Dense parameters are averaged over the ``dp`` group, expert parameters over the ``edp`` group; both
    divide by the full DP size because an expert's gradient already sums the tokens of its whole ep group.
    Buckets fill in reverse parameter order (roughly the order the backward produces gradients) and are
    launched strictly in bucket order, so every rank issues the same sequence of all-reduces.
    """

    def __init__(self, groups: list[tuple[list[nn.Parameter], Group]], dp: int, bucket_bytes: int):
        self.dp, self.armed = dp, False
        self.scale_only: list[nn.Parameter] = []   # parameters whose group has one rank
        self.buckets: list[_Bucket] = []
        self.bucket_of: dict[nn.Parameter, _Bucket] = {}
        for params, group in groups:
            if group_size(group) == 1:
                self.scale_only += params
                continue
            current, size = [], 0
            for p in reversed(params):
                current.append(p)
                size += p.numel() * p.element_size()
                if size >= bucket_bytes:
                    self.buckets.append(_Bucket(current, group))
                    current, size = [], 0
            if current:
                self.buckets.append(_Bucket(current, group))
        for b in self.buckets:
            for p in b.params:
                self.bucket_of[p] = b
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.next_launch = 0

    def arm(self) -> None:
        """Call before the last microbatch's backward: only then are the gradients complete."""
        self.armed = True

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.armed:
            return
        self.bucket_of[p].ready += 1
        while self.next_launch < len(self.buckets) and \
                self.buckets[self.next_launch].ready == len(self.buckets[self.next_launch].params):
            self._launch(self.buckets[self.next_launch])
            self.next_launch += 1

    def _launch(self, b: _Bucket) -> None:
        b.flat = torch.cat([p.grad.reshape(-1) for p in b.params]).div_(self.dp)
        b.work = dist.all_reduce(b.flat, group=b.group, async_op=True)

    def finish(self) -> None:
        """Wait for every bucket (launching any a hook never completed) and write the averages back."""
        for b in self.buckets[self.next_launch:]:
            sys.stderr.write(f"moe_gpt: warning: a bucket of {len(b.params)} parameters was launched late\n")
            for p in b.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._launch(b)
        for b in self.buckets:
            b.work.wait()
            offset = 0
            for p in b.params:
                p.grad.copy_(b.flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            b.ready, b.flat, b.work = 0, None, None
        for p in self.scale_only:
            if p.grad is not None and self.dp > 1:
                p.grad.div_(self.dp)
        self.next_launch, self.armed = 0, False


# ---------------------------------------------------------------- gradient clipping

def reduce_tp_partial_grads(params: list[nn.Parameter], lay: Layout) -> None:
    """Sum over TP the gradients of replicated parameters that each TP rank saw only part of."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads and group_size(lay.tp_group) > 1:
        flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]), lay.tp_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def clip_grad_norm(dense_sharded: list[nn.Parameter], dense_replicated: list[nn.Parameter],
                   experts: list[nn.Parameter], lay: Layout, max_norm: float,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """Clip to the norm of the FULL model's gradient; returns that norm.

    Every parameter is counted once: TP-replicated ones on tp_idx 0 only; TP shards are summed over tp;
    stages over pp; experts over ep (they differ inside an ep group); nothing over DP (grads are averaged).
    """
    def sq(params):
        return sum((p.grad.double().pow(2).sum() for p in params if p.grad is not None),
                   torch.zeros((), dtype=torch.float64, device=device))
    dense = sq(dense_sharded) + (sq(dense_replicated) if lay.tp_idx == 0 else 0.0)
    expert = all_reduce(sq(experts), lay.ep_group)
    total = all_reduce(all_reduce(dense + expert, lay.tp_group), lay.pp_group)
    norm = total.sqrt().float()
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in dense_sharded + dense_replicated + experts:
            if p.grad is not None:
                p.grad.mul_(coef)
    return norm
