"""Synthetic job graphs with real structure, as `SweepGraph` arrays: for tests and the benchmark.

- `training_graph`: a Megatron-style step at any scale (8192 ranks x ~2000 events in a few seconds):
  rank = tp + TP * (dp + DP * pp); per microbatch and layer, sync TP all-reduces and EP all-to-alls
  (dispatch, combine; EP groups carved from DP); a 1F1B pipeline with send/recv of activations and
  gradients between stages (sends overlapped with compute, waited later); the DP gradient all-reduce in
  buckets issued asynchronously during the last backward and waited at the end of the step, except the
  last bucket, consumed through a future (no wait event, as DDP does). Built per stage from one template
  and tiled over the stage's ranks, so it is vectorized.
- `random_graph`: small irregular graphs (random groups, p2p, sync/async/no-wait ops, zero durations);
  deadlock-free by construction: every rank issues its ops in one global order, and waits come after
  their op, so whoever a blocked rank waits for is blocked on an earlier comm, or not at all.
- `from_programs`: a graph written by hand, one list of events per rank (tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism.calibrate.arrays import (
    K_COLLECTIVE,
    K_COMPUTE,
    K_MARKER,
    K_RECV,
    K_SEND,
    K_WAIT,
    KINDS,
    SweepGraph,
)

_KIND = {"compute": K_COMPUTE, "marker": K_MARKER, "coll": K_COLLECTIVE, "send": K_SEND, "recv": K_RECV,
         "wait": K_WAIT}


@dataclass(eq=False)
class Synthetic:
    """A graph with durations (one per event) and transfers (one per comm)."""

    graph: SweepGraph
    durations: np.ndarray
    transfer: np.ndarray


# ------------------------------------------------------------------------------------- by hand


def from_programs(programs: list[list[tuple]], transfer: dict | None = None) -> Synthetic:
    """A graph from per-rank event lists.

    Events: ``("compute", dur)``, ``("marker", dur)``, ``("coll", key, dur)``, ``("send", key, dur)``,
    ``("recv", key, dur)``, ``("wait", i, dur)`` where ``i`` is the index of the op in the same rank's
    list. Ops sharing a key form one comm (a collective, or a send/recv pair); ``transfer`` maps a key to
    its transfer time (default 0).
    """
    kinds, comms, waits, durs, ptr = [], [], [], [], [0]
    keys: dict = {}
    p2p: list[bool] = []
    for program in programs:
        base = len(kinds)
        for event in program:
            name, *args = event
            kinds.append(_KIND[name])
            durs.append(args[-1])
            comm, target = -1, -1
            if name in ("coll", "send", "recv"):
                if args[0] not in keys:
                    keys[args[0]] = len(keys)
                    p2p.append(name != "coll")
                comm = keys[args[0]]
            elif name == "wait":
                target = base + args[0]
            comms.append(comm)
            waits.append(target)
        ptr.append(len(kinds))
    transfer = transfer or {}
    graph = SweepGraph(
        rank_ptr=np.array(ptr, dtype=np.int64),
        kind=np.array(kinds, dtype=np.int8),
        comm=np.array(comms, dtype=np.int64),
        wait_op=np.array(waits, dtype=np.int64),
        comm_p2p=np.array(p2p, dtype=bool),
    )
    xfer = np.array([transfer.get(k, 0) for k in keys], dtype=np.int64)
    return Synthetic(graph, np.array(durs, dtype=np.int64), xfer)


# ------------------------------------------------------------------------------------- random


def random_graph(
    seed: int,
    ranks: int = 6,
    comms: int = 60,
    p2p: float = 0.3,
    async_: float = 0.3,
    no_wait: float = 0.1,
    zero: float = 0.1,
    max_ns: int = 1000,
) -> Synthetic:
    """An irregular, deadlock-free graph (see the module docstring) with random durations."""
    rng = np.random.default_rng(seed)
    programs: list[list[tuple]] = [[] for _ in range(ranks)]
    pending: list[list[list[int]]] = [[] for _ in range(ranks)]  # [op index, events left before its wait]

    def dur() -> int:
        return 0 if rng.random() < zero else int(rng.integers(0, max_ns))

    def append(r: int, event: tuple) -> None:
        programs[r].append(event)
        for item in pending[r]:
            item[1] -= 1
        due = [item for item in pending[r] if item[1] <= 0]
        pending[r] = [item for item in pending[r] if item[1] > 0]
        for op, _ in due:
            append(r, ("wait", op, dur()))

    def issue(r: int, event: tuple) -> None:
        for _ in range(int(rng.integers(0, 3))):
            append(r, ("compute", dur()) if rng.random() < 0.8 else ("marker", dur()))
        op = len(programs[r])
        append(r, event)
        roll = rng.random()
        if roll < no_wait:
            return
        if roll < no_wait + async_:
            pending[r].append([op, int(rng.integers(1, 6))])
        else:
            append(r, ("wait", op, dur()))

    transfer = {}
    for key in range(comms):
        transfer[key] = dur()
        if ranks >= 2 and rng.random() < p2p:
            src, dst = rng.choice(ranks, size=2, replace=False)
            issue(int(src), ("send", key, dur()))
            issue(int(dst), ("recv", key, dur()))
        else:
            size = int(rng.integers(1, ranks + 1))
            for r in sorted(rng.choice(ranks, size=size, replace=False).tolist()):
                issue(r, ("coll", key, dur()))
    for r in range(ranks):
        for op, _ in pending[r]:
            programs[r].append(("wait", op, dur()))
        programs[r].append(("compute", dur()))
    return from_programs(programs, transfer)


# ------------------------------------------------------------------------------------- training step

# template comm types
_NONE, _TP, _EP, _DP, _FSEND, _FRECV, _BSEND, _BRECV = range(8)
OPS = ["compute", "all_reduce", "all_to_all_single", "send", "recv", "fwd_begin", "fwd_end", "bwd_begin",
       "bwd_end", "iteration_end", "optimizer"]
GROUPS = ["tp", "ep", "dp", "pp"]
_GROUP_OF = {_TP: 0, _EP: 1, _DP: 2, _FSEND: 3, _FRECV: 3, _BSEND: 3, _BRECV: 3}
# duration classes: (low, high) ns
_D_LAYER, _D_GLUE, _D_MARK, _D_ISSUE, _D_WAIT, _D_OPT = range(6)
_DUR = {_D_LAYER: (100_000, 400_000), _D_GLUE: (2_000, 20_000), _D_MARK: (500, 3_000),
        _D_ISSUE: (5_000, 30_000), _D_WAIT: (1_000, 8_000), _D_OPT: (1_000_000, 3_000_000)}
_XFER = {_TP: (30_000, 80_000), _EP: (50_000, 200_000), _DP: (500_000, 2_000_000), _FSEND: (50_000, 150_000),
         _BSEND: (50_000, 150_000)}


@dataclass(frozen=True)
class Layout:
    tp: int = 8
    pp: int = 8
    dp: int = 128
    ep: int = 8
    microbatches: int = 8
    layers: int = 5
    iterations: int = 2
    buckets: int = 4  # DP all-reduce buckets per step (the last one has no wait event)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


def _stage_template(L: Layout, p: int) -> list[tuple]:
    """Stage p's events for all iterations: (kind, comm type, instance, op, duration class, wait target)."""
    t: list[tuple] = []
    count = {_TP: 0, _EP: 0, _DP: 0}

    def ev(kind, ctype=_NONE, k=-1, op="compute", dclass=_D_GLUE, target=-1) -> int:
        t.append((kind, ctype, k, OPS.index(op), dclass, target))
        return len(t) - 1

    def collective(ctype: int, op: str, sync: bool = True) -> int:
        i = ev(K_COLLECTIVE, ctype, count[ctype], op, _D_ISSUE)
        count[ctype] += 1
        if sync:
            ev(K_WAIT, op=op, dclass=_D_WAIT, target=i)
        return i

    def layer(backward: bool) -> None:
        ev(K_COMPUTE, dclass=_D_LAYER)
        if L.tp > 1:
            collective(_TP, "all_reduce")
        ev(K_COMPUTE)
        if L.ep > 1:
            collective(_EP, "all_to_all_single")
        ev(K_COMPUTE, dclass=_D_LAYER)
        if L.ep > 1:
            collective(_EP, "all_to_all_single")
        if L.tp > 1:
            collective(_TP, "all_reduce")

    def recv(ctype: int, k: int) -> None:
        i = ev(K_RECV, ctype, k, "recv", _D_ISSUE)
        ev(K_WAIT, op="recv", dclass=_D_WAIT, target=i)

    def send(ctype: int, k: int) -> None:
        i = ev(K_SEND, ctype, k, "send", _D_ISSUE)
        ev(K_COMPUTE)
        ev(K_WAIT, op="send", dclass=_D_WAIT, target=i)

    def forward(it: int, mb: int) -> None:
        k = it * L.microbatches + mb
        if p > 0:
            recv(_FRECV, k)
        ev(K_MARKER, op="fwd_begin", dclass=_D_MARK)
        for _ in range(L.layers):
            layer(False)
        ev(K_MARKER, op="fwd_end", dclass=_D_MARK)
        if p < L.pp - 1:
            send(_FSEND, k)

    def backward(it: int, mb: int, buckets: list[int]) -> None:
        k = it * L.microbatches + mb
        if p < L.pp - 1:
            recv(_BRECV, k)
        ev(K_MARKER, op="bwd_begin", dclass=_D_MARK)
        last = mb == L.microbatches - 1
        every = max(1, L.layers // max(1, L.buckets))
        for j in range(L.layers):
            layer(True)
            if last and L.dp > 1 and len(buckets) < L.buckets and (j + 1) % every == 0:
                buckets.append(collective(_DP, "all_reduce", sync=False))
        while last and L.dp > 1 and len(buckets) < L.buckets:
            buckets.append(collective(_DP, "all_reduce", sync=False))
        ev(K_MARKER, op="bwd_end", dclass=_D_MARK)
        if p > 0:
            send(_BSEND, k)

    M = L.microbatches
    warmup = min(L.pp - p - 1, M)
    for it in range(L.iterations):
        buckets: list[int] = []
        order = [("f", i) for i in range(warmup)]
        for i in range(M - warmup):
            order += [("f", warmup + i), ("b", i)]
        order += [("b", i) for i in range(M - warmup, M)]
        for what, mb in order:
            if what == "f":
                forward(it, mb)
            else:
                backward(it, mb, buckets)
        for i in buckets[:-1]:  # the last bucket is consumed through its future: no wait event
            ev(K_WAIT, op="all_reduce", dclass=_D_WAIT, target=i)
        ev(K_COMPUTE, op="optimizer", dclass=_D_OPT)
        ev(K_MARKER, op="iteration_end", dclass=_D_MARK)
    return t


def training_graph(layout: Layout = Layout(), seed: int = 0, labels: bool = True) -> Synthetic:
    """A training job's graph at `layout`'s scale, with random durations and transfers."""
    L = layout
    TP, PP, DP, EP, M = L.tp, L.pp, L.dp, L.ep, L.microbatches
    if DP % EP:
        raise ValueError(f"ep={EP} must divide dp={DP}")
    rng = np.random.default_rng(seed)
    templates = [np.array(_stage_template(L, p), dtype=np.int64).reshape(-1, 6) for p in range(PP)]
    def count(template: np.ndarray, ctype: int) -> int:
        return int(np.sum((template[:, 1] == ctype) & (template[:, 0] == K_COLLECTIVE)))

    n_of = {c: count(templates[0], c) for c in (_TP, _EP, _DP)}  # the same on every stage
    assert all(count(t, c) == n_of[c] for t in templates for c in n_of)
    n_p2p = L.iterations * M
    sizes = {
        _TP: PP * DP * n_of[_TP] if TP > 1 else 0,
        _EP: PP * TP * (DP // EP) * n_of[_EP] if EP > 1 else 0,
        _DP: PP * TP * n_of[_DP] if DP > 1 else 0,
        _FSEND: (PP - 1) * TP * DP * n_p2p,
        _BSEND: (PP - 1) * TP * DP * n_p2p,
    }
    offset, total = {}, 0
    for c in (_TP, _EP, _DP, _FSEND, _BSEND):
        offset[c], total = total, total + sizes[c]
    per_stage = TP * DP
    lengths = np.repeat([len(t) for t in templates], per_stage)
    rank_ptr = np.zeros(L.world + 1, dtype=np.int64)
    np.cumsum(lengths, out=rank_ptr[1:])
    n = int(rank_ptr[-1])
    kind = np.empty(n, dtype=np.int8)
    comm = np.empty(n, dtype=np.int64)
    wait_op = np.empty(n, dtype=np.int64)
    op_code = np.empty(n, dtype=np.int8) if labels else None
    group_code = np.empty(n, dtype=np.int8) if labels else None
    durations = np.empty(n, dtype=np.int64)
    for p, tpl in enumerate(templates):
        ranks = np.arange(p * per_stage, (p + 1) * per_stage)
        tp, dp = ranks % TP, (ranks // TP) % DP
        lo, hi = int(rank_ptr[ranks[0]]), int(rank_ptr[ranks[-1] + 1])
        shape = (per_stage, len(tpl))
        kind[lo:hi] = np.broadcast_to(tpl[:, 0], shape).ravel()
        ctype, k = tpl[:, 1], tpl[:, 2]
        ids = np.full(shape, -1, dtype=np.int64)
        col = lambda x: x[:, None]  # noqa: E731
        for c, sel in ((_TP, ctype == _TP), (_EP, ctype == _EP), (_DP, ctype == _DP)):
            if sel.any():
                group = {_TP: p * DP + dp, _EP: (p * TP + tp) * (DP // EP) + dp // EP, _DP: p * TP + tp}[c]
                ids[:, sel] = offset[c] + col(group) * n_of[c] + k[sel]
        link = tp + TP * dp
        # a p2p link is numbered by its lower stage: the sender going forward, the receiver going back
        for c, low_stage in ((_FSEND, p), (_FRECV, p - 1), (_BSEND, p - 1), (_BRECV, p)):
            sel = ctype == c
            if sel.any():
                base = offset[_FSEND if c in (_FSEND, _FRECV) else _BSEND]
                ids[:, sel] = base + (low_stage * per_stage + col(link)) * n_p2p + k[sel]
        comm[lo:hi] = ids.ravel()
        target = tpl[:, 5]
        waits = np.where(target >= 0, col(rank_ptr[ranks]) + target, -1)
        wait_op[lo:hi] = waits.ravel()
        if labels:
            op_code[lo:hi] = np.broadcast_to(tpl[:, 3], shape).ravel()
            groups = np.array([_GROUP_OF.get(int(c), -1) for c in ctype], dtype=np.int8)
            group_code[lo:hi] = np.broadcast_to(groups, shape).ravel()
        dclass = tpl[:, 4]
        seg = durations[lo:hi].reshape(shape)
        for d, (low, high) in _DUR.items():
            sel = dclass == d
            if sel.any():
                seg[:, sel] = rng.integers(low, high, size=(per_stage, int(sel.sum())))
    comm_p2p = np.zeros(total, dtype=bool)
    comm_p2p[offset[_FSEND] :] = True
    transfer = np.empty(total, dtype=np.int64)
    for c, (low, high) in _XFER.items():
        transfer[offset[c] : offset[c] + sizes[c]] = rng.integers(low, high, size=sizes[c])
    graph = SweepGraph(
        rank_ptr, kind, comm, wait_op, comm_p2p,
        op_code=op_code, op_names=OPS if labels else [],
        group_code=group_code, group_names=GROUPS if labels else [],
    )
    return Synthetic(graph, durations, transfer)


def layout_for(ranks: int) -> Layout:
    """A plausible layout for `ranks` (a power of two >= 2): TP up to 8, PP up to 8, EP up to 8, DP the rest."""
    if ranks < 2 or ranks & (ranks - 1):
        raise ValueError(f"ranks must be a power of two >= 2, got {ranks}")
    tp = min(8, ranks)
    pp = min(8, ranks // tp)
    dp = ranks // (tp * pp)
    if dp == 1 and pp > 1:
        pp, dp = pp // 2, 2
    return Layout(tp=tp, pp=pp, dp=dp, ep=min(8, dp))


__all__ = ["KINDS", "Layout", "Synthetic", "from_programs", "layout_for", "random_graph", "training_graph"]
