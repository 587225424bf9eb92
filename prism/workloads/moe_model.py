"""A small Qwen3-MoE-style decoder whose modules hold only this rank's shard (Megatron-style).

RMSNorm, RoPE, grouped-query attention with QK-norm, a top-k routed MoE FFN (SwiGLU experts, normalised
top-k weights) with a per-sequence load-balancing loss, untied vocab-parallel embedding and LM head.

Every weight is first drawn in FULL from a generator seeded by (seed, parameter name) -- the same on every
rank and in every layout -- and then sliced to this rank's shard, so all layouts compute the same function.

Parameter tags read by the training loop:
  ``tp_sharded``  this rank holds a TP slice (counted on every TP rank by the gradient norm);
  ``tp_partial``  replicated over TP, but each TP rank sees only its heads' share of the gradient
                  (QK-norm weights, K/V weights when kv-heads are replicated): summed over TP before the step;
  ``expert``      an expert weight: averaged over the edp group instead of dp.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .parallel import Layout, all_reduce, all_to_all, copy_to_tp, exchange_counts, reduce_from_tp


@dataclass
class ModelConfig:
    vocab: int = 128
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    experts: int = 4
    topk: int = 2
    ffn_hidden: int = 128
    seq_len: int = 32
    seed: int = 0
    rope_theta: float = 10000.0
    eps: float = 1e-6
    init_std: float = 0.02


def full_weight(cfg: ModelConfig, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The complete (unsharded) initial value of parameter ``name``: identical on every rank."""
    g = torch.Generator().manual_seed(cfg.seed * 2**40 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * cfg.init_std


def param(t: torch.Tensor, **tags: bool) -> nn.Parameter:
    p = nn.Parameter(t.contiguous().clone())
    for k, v in tags.items():
        setattr(p, k, v)
    return p


def stage_layers(layers: int, pp: int, pp_idx: int) -> range:
    """Layers of stage ``pp_idx``, split as evenly as possible (earlier stages take the remainder)."""
    base, extra = divmod(layers, pp)
    start = pp_idx * base + min(pp_idx, extra)
    return range(start, start + base + (pp_idx < extra))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Heads split over TP (column-parallel Q/K/V, row-parallel output); kv-heads split when divisible."""

    def __init__(self, cfg: ModelConfig, lay: Layout, name: str):
        super().__init__()
        self.tp_group, hd = lay.tp_group, cfg.hidden // cfg.heads
        self.hd, self.hl = hd, cfg.heads // lay.tp
        q0 = lay.tp_idx * self.hl
        kv_split = cfg.kv_heads % lay.tp == 0
        self.kvl = cfg.kv_heads // lay.tp if kv_split else cfg.kv_heads
        kv0 = lay.tp_idx * self.kvl if kv_split else 0
        kv_partial = lay.tp > 1 and not kv_split
        wq = full_weight(cfg, f"{name}.wq", (cfg.heads * hd, cfg.hidden))
        wk = full_weight(cfg, f"{name}.wk", (cfg.kv_heads * hd, cfg.hidden))
        wv = full_weight(cfg, f"{name}.wv", (cfg.kv_heads * hd, cfg.hidden))
        wo = full_weight(cfg, f"{name}.wo", (cfg.hidden, cfg.heads * hd))
        self.wq = param(wq[q0 * hd:(q0 + self.hl) * hd], tp_sharded=True)
        self.wk = param(wk[kv0 * hd:(kv0 + self.kvl) * hd], tp_sharded=kv_split, tp_partial=kv_partial)
        self.wv = param(wv[kv0 * hd:(kv0 + self.kvl) * hd], tp_sharded=kv_split, tp_partial=kv_partial)
        self.wo = param(wo[:, q0 * hd:(q0 + self.hl) * hd], tp_sharded=True)
        self.q_norm, self.k_norm = RMSNorm(hd, cfg.eps), RMSNorm(hd, cfg.eps)
        for p in (self.q_norm.weight, self.k_norm.weight):
            p.tp_partial = lay.tp > 1
        # which local kv head each local query head reads
        kv_of_q = (torch.arange(self.hl) + q0) // (cfg.heads // cfg.kv_heads) - kv0
        self.register_buffer("kv_of_q", kv_of_q, persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        x = copy_to_tp(x, self.tp_group)
        q = F.linear(x, self.wq).view(B, S, self.hl, self.hd).transpose(1, 2)
        k = F.linear(x, self.wk).view(B, S, self.kvl, self.hd).transpose(1, 2)
        v = F.linear(x, self.wv).view(B, S, self.kvl, self.hd).transpose(1, 2)
        q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        k, v = k[:, self.kv_of_q], v[:, self.kv_of_q]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, S, self.hl * self.hd)
        return reduce_from_tp(F.linear(o, self.wo), self.tp_group)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts: experts sharded over EP, each expert's FFN dimension over TP."""

    def __init__(self, cfg: ModelConfig, lay: Layout, name: str):
        super().__init__()
        self.E, self.k, self.ep = cfg.experts, cfg.topk, lay.ep
        self.El = cfg.experts // lay.ep
        self.tp_group, self.ep_group = lay.tp_group, lay.ep_group
        e0, fl = lay.ep_idx * self.El, cfg.ffn_hidden // lay.tp
        f0 = lay.tp_idx * fl
        E, H, Fh = cfg.experts, cfg.hidden, cfg.ffn_hidden
        self.router = param(full_weight(cfg, f"{name}.router", (E, H)))
        w1 = full_weight(cfg, f"{name}.w1", (E, Fh, H))
        w3 = full_weight(cfg, f"{name}.w3", (E, Fh, H))
        w2 = full_weight(cfg, f"{name}.w2", (E, H, Fh))
        tags = dict(tp_sharded=True, expert=True)
        self.w1 = param(w1[e0:e0 + self.El, f0:f0 + fl], **tags)
        self.w3 = param(w3[e0:e0 + self.El, f0:f0 + fl], **tags)
        self.w2 = param(w2[e0:e0 + self.El, :, f0:f0 + fl], **tags)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the FFN output and the per-sequence balance loss, shape [B]."""
        B, S, H = x.shape
        h = x.reshape(B * S, H)
        probs = F.linear(h, self.router).softmax(dim=-1)
        top_w, top_i = probs.topk(self.k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        aux = self.balance_loss(probs.view(B, S, self.E), top_i.view(B, S, self.k), valid)
        y = self.dispatch_and_combine(copy_to_tp(h, self.tp_group), top_i)     # [T, k, H], partial over TP
        out = (y * copy_to_tp(top_w, self.tp_group).unsqueeze(-1)).sum(dim=1)
        return reduce_from_tp(out, self.tp_group).view(B, S, H), aux

    def balance_loss(self, probs: torch.Tensor, top_i: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Switch-style E * sum_e f_e * P_e per sequence over its valid tokens (layout-independent)."""
        mask = valid.to(probs.dtype).unsqueeze(-1)                              # [B, S, 1]
        n = mask.sum(dim=1).clamp(min=1.0)                                      # [B, 1]
        hits = F.one_hot(top_i, self.E).sum(dim=2).to(probs.dtype)              # [B, S, E]
        f = (hits * mask).sum(dim=1) / (n * self.k)
        p = (probs * mask).sum(dim=1) / n
        return self.E * (f * p).sum(dim=-1)

    def expert_ffn(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.w1[e])) * F.linear(x, self.w3[e]), self.w2[e])

    def dispatch_and_combine(self, h: torch.Tensor, top_i: torch.Tensor) -> torch.Tensor:
        T, k = top_i.shape
        flat = top_i.reshape(-1)                            # assignment a belongs to token a // k
        order = torch.argsort(flat, stable=True)            # group assignments by expert
        xs = h[order // k]
        counts = torch.bincount(flat, minlength=self.E)     # per global expert, experts ordered by EP rank
        recv_counts = exchange_counts(counts, self.ep_group)   # [ep * El]: per source rank, per local expert
        send_splits = counts.view(self.ep, self.El).sum(1).tolist()
        recv_splits = recv_counts.view(self.ep, self.El).sum(1).tolist()
        xr = all_to_all(xs, recv_splits, send_splits, self.ep_group)
        if self.ep > 1:   # received rows are grouped by source rank; regroup them by local expert
            row_expert = torch.arange(self.El, device=h.device).repeat(self.ep).repeat_interleave(recv_counts)
            regroup = torch.argsort(row_expert, stable=True)
            xr = xr[regroup]
        per_expert = recv_counts.view(self.ep, self.El).sum(0).tolist()
        # every local expert runs, even on zero tokens, so each weight always gets a gradient
        yr = torch.cat([self.expert_ffn(e, chunk) for e, chunk in enumerate(xr.split(per_expert))])
        if self.ep > 1:
            yr = yr[torch.argsort(regroup)]
        ys = all_to_all(yr, send_splits, recv_splits, self.ep_group)
        return ys[torch.argsort(order)].view(T, k, -1)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, lay: Layout, name: str):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.hidden, cfg.eps), Attention(cfg, lay, f"{name}.attn")
        self.ffn_norm, self.moe = RMSNorm(cfg.hidden, cfg.eps), MoE(cfg, lay, f"{name}.moe")

    def forward(self, x, cos, sin, valid):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        m, aux = self.moe(self.ffn_norm(x), valid)
        return x + m, aux


class Stage(nn.Module):
    """The layers of this pipeline stage; the first stage embeds, the last produces vocab-parallel logits."""

    def __init__(self, cfg: ModelConfig, lay: Layout):
        super().__init__()
        self.lay, self.vl = lay, cfg.vocab // lay.tp
        v0 = lay.tp_idx * self.vl
        if lay.first_stage:
            self.embed = param(full_weight(cfg, "embed", (cfg.vocab, cfg.hidden))[v0:v0 + self.vl], tp_sharded=True)
        layers = stage_layers(cfg.layers, lay.pp, lay.pp_idx)
        self.blocks = nn.ModuleList(Block(cfg, lay, f"layers.{i}") for i in layers)
        if lay.last_stage:
            self.norm = RMSNorm(cfg.hidden, cfg.eps)
            self.head = param(full_weight(cfg, "head", (cfg.vocab, cfg.hidden))[v0:v0 + self.vl], tp_sharded=True)
        cos, sin = rope_tables(cfg.seq_len, cfg.hidden // cfg.heads, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: token ids [B, S] on the first stage, else hidden states [B, S, H]. Returns the hidden states
        (local logits [B, S, V/tp] on the last stage) and this stage's balance loss per sequence, [B]."""
        tp_group = self.lay.tp_group
        if self.lay.first_stage:   # vocab-parallel embedding: each TP rank looks up its vocab slice
            local = x - self.lay.tp_idx * self.vl
            inside = (local >= 0) & (local < self.vl)
            x = reduce_from_tp(F.embedding(local.clamp(0, self.vl - 1), self.embed) * inside.unsqueeze(-1), tp_group)
        aux = x.new_zeros(x.shape[0])
        for block in self.blocks:
            x, a = block(x, self.cos, self.sin, valid)
            aux = aux + a
        if self.lay.last_stage:
            x = F.linear(copy_to_tp(self.norm(x), tp_group), self.head)
        return x, aux


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, lay: Layout) -> torch.Tensor:
    """Per-token cross-entropy from vocab-sharded logits [N, V/tp]; targets < 0 are padding (loss 0)."""
    vl = logits.shape[-1]
    m = all_reduce(logits.detach().amax(dim=-1, keepdim=True), lay.tp_group, dist.ReduceOp.MAX)
    z = logits - m
    sum_exp = reduce_from_tp(z.exp().sum(dim=-1), lay.tp_group)
    local = targets - lay.tp_idx * vl
    inside = (local >= 0) & (local < vl)
    target_logit = z.gather(-1, local.clamp(0, vl - 1).unsqueeze(-1)).squeeze(-1) * inside
    target_logit = reduce_from_tp(target_logit, lay.tp_group)
    return (sum_exp.log() - target_logit) * (targets >= 0)
