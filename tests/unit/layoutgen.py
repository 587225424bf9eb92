"""The graph tables the slice planner reads, for the reference MoE workload's layout at any W, without a capture.

`moe_graph(tp, pp, dp, ep)` builds what `prism.slices.plan.plan_tables` needs (events: rank, seq, kind, op, bytes,
comm_id, is_async; comms: comm_id, kind, group_name, src, dst, members, bytes; ranks: rank, pp; groups: group_name, group_desc,
members) with the structure of `prism.workloads.moe_gpt` (rank = t + tp * (d + dp * p); groups tp, dp, pp, ep, edp as
`prism.workloads.parallel` makes them) and one iteration's operations per rank as a capture of it counts them
(W=64 tp2·pp2·dp16·ep2, iteration 1: per microbatch and layer the TP all-reduces, the EP count exchange and the
two token all-to-alls, whose sizes follow the routing: random per rank and call; the PP sends and receives; then
the DP and EDP gradient all-reduces, the PP and DP loss all-reduces). Sizes are the capture's (2,048 B a TP
all-reduce or activation, ~1.6 KiB a token all-to-all, 83 KB a DP all-reduce). `tests/unit/test_slice_classes.py`
checks that the planner measures as many slices on it as on real captures of the same layouts (W = 16, 64, 256).
"""

from __future__ import annotations

import random

import polars as pl


def moe_graph(tp: int, pp: int, dp: int, ep: int, seed: int = 0) -> tuple[pl.DataFrame, ...]:
    rng = random.Random(seed)
    world = tp * pp * dp

    def rank(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    groups: dict[str, tuple[str, list[int]]] = {"0": ("default_pg", list(range(world)))}
    of: dict[tuple[str, int], str] = {}  # (desc, rank) -> group name

    def add(desc: str, members: list[int]) -> None:
        name = str(len(groups))
        groups[name] = (desc, members)
        for m in members:
            of[desc, m] = name

    for p in range(pp):
        for d in range(dp):
            add("tp", [rank(t, d, p) for t in range(tp)])
    for p in range(pp):
        for t in range(tp):
            add("dp", [rank(t, d, p) for d in range(dp)])
    for d in range(dp):
        for t in range(tp):
            add("pp", [rank(t, d, p) for p in range(pp)])
    for p in range(pp):
        for t in range(tp):
            for b in range(dp // ep):
                add("ep", [rank(t, b * ep + i, p) for i in range(ep)])
            for i in range(ep):
                add("edp", [rank(t, b * ep + i, p) for b in range(dp // ep)])

    events = {k: [] for k in ("rank", "seq", "kind", "op", "bytes", "comm_id", "is_async")}
    comms = {k: [] for k in ("comm_id", "kind", "group_name", "src", "dst", "members", "bytes")}
    seq = [0] * world
    pending: dict[tuple[str, str], int] = {}  # (group, per-group call) -> comm_id

    def emit(r: int, kind: str, op: str, nbytes: int, comm: int, is_async: bool = False) -> None:
        for k, v in zip(events, (r, seq[r], kind, op, nbytes, comm, is_async)):
            events[k].append(v)
        seq[r] += 1

    calls: dict[tuple[str, int], int] = {}

    def collective(r: int, desc: str, op: str, nbytes: int, is_async: bool = False) -> None:
        name = of[desc, r] if desc != "world" else "0"
        n = calls.get((name, r), 0)
        calls[name, r] = n + 1
        key = (name, str(n))
        if key not in pending:
            pending[key] = len(comms["kind"])
            members = groups[name][1]
            for k, v in zip(comms, (pending[key], "collective", name, -1, -1, members, nbytes * len(members))):
                comms[k].append(v)
        emit(r, "collective", op, nbytes, pending[key], is_async)

    p2p: dict[tuple[int, int, int], int] = {}

    def message(r: int, kind: str, peer: int, nbytes: int) -> None:
        src, dst = (r, peer) if kind == "send" else (peer, r)
        n = calls.get(("p2p", src, dst, kind), 0)
        calls["p2p", src, dst, kind] = n + 1
        key = (src, dst, n)
        if key not in p2p:
            p2p[key] = len(comms["kind"])
            for k, v in zip(comms, (p2p[key], "p2p", of["pp", r], src, dst, [src, dst], nbytes)):
                comms[k].append(v)
        emit(r, kind, "send" if kind == "send" else "recv", nbytes, p2p[key])

    for r in range(world):
        t, d, p = r % tp, (r // tp) % dp, r // (tp * dp)
        route = random.Random(rng.randrange(1 << 30))  # the data's routing: its own per rank
        for direction in ("forward", "backward"):
            for _mb in range(pp):
                if direction == "forward" and p > 0:
                    message(r, "recv", rank(t, d, p - 1), 2048)
                if direction == "backward" and p < pp - 1:
                    message(r, "recv", rank(t, d, p + 1), 2048)
                collective(r, "tp", "all_reduce", 1024)
                collective(r, "ep", "all_to_all_single", 8 * ep)  # the token counts: fixed size
                collective(r, "ep", "all_to_all_single", 128 * route.randint(6, 20))  # the tokens: the routing's
                collective(r, "ep", "all_to_all_single", 128 * route.randint(6, 20))
                collective(r, "tp", "all_reduce", 1024)
                if direction == "forward" and p < pp - 1:
                    message(r, "send", rank(t, d, p + 1), 2048)
                if direction == "backward" and p > 0:
                    message(r, "send", rank(t, d, p - 1), 2048)
        for _bucket in range(3 if p == 0 else 2):  # the first stage holds the embedding: one bucket more
            collective(r, "dp", "all_reduce", 83_187 // dp, is_async=True)  # gradient buckets: overlapped
        collective(r, "edp", "all_reduce", 49_152 // max(1, dp // ep), is_async=True)
        collective(r, "ep", "all_reduce", 8)
        collective(r, "pp", "all_reduce", 6)
        collective(r, "dp", "all_reduce", 4)
    ev = pl.DataFrame(events, schema={"rank": pl.Int32, "seq": pl.Int64, "kind": pl.Utf8, "op": pl.Utf8,
                                      "bytes": pl.Int64, "comm_id": pl.Int64, "is_async": pl.Boolean})
    cm = pl.DataFrame(comms, schema={"comm_id": pl.Int64, "kind": pl.Utf8, "group_name": pl.Utf8, "src": pl.Int32, "dst": pl.Int32,
                                     "members": pl.List(pl.Int32), "bytes": pl.Int64})
    rk = pl.DataFrame({"rank": list(range(world)), "pp": [r // (tp * dp) for r in range(world)]},
                      schema={"rank": pl.Int32, "pp": pl.Int32})
    gr = pl.DataFrame({"group_name": list(groups), "group_desc": [g[0] for g in groups.values()],
                       "members": [g[1] for g in groups.values()]},
                      schema={"group_name": pl.Utf8, "group_desc": pl.Utf8, "members": pl.List(pl.Int32)})
    return ev, cm, rk, gr
