"""The replay server's op builders: a virtual member issuing a collective from its recorded contribution
(payload meta as capture writes it) gives the real member what the real peer would have given it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from prism.runtime.replay.plan import Collective, ReplayError, ReplayPlan
from prism.runtime.slice import replay_server
from tests.conftest import free_port

N = 3  # member 0 runs "for real"; members 1 and 2 are virtual


@pytest.fixture(scope="module")
def pgs():
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    made: dict[int, ProcessGroupGloo] = {}

    def make(r: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        made[r] = ProcessGroupGloo(PrefixStore("t/", client), r, N, timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(r,)) for r in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    yield made
    del master


def _x(member: int, shape=(4,)) -> torch.Tensor:
    return torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape) + 10 * member


def _shapes(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else [_shapes(y) for y in x]


def _run(pgs, real, op: str, root: int, contribution):
    """Member 0 runs `real(pg)` (returns (work, outputs)); members 1..N-1 replay `contribution(member)`
    = (meta, tensors) or None. Returns member 0's outputs."""
    box = {}

    def real_side():
        work, outs = real(pgs[0])
        work.wait()
        box["out"] = outs

    t = threading.Thread(target=real_side)
    t.start()
    root_payload = contribution(root) if root >= 0 else None
    works = [replay_server.issue(pgs[m], op, m, N, root, contribution(m), root_payload) for m in range(1, N)]
    for w in works:
        w.wait()
    t.join(30)
    assert not t.is_alive()
    return box["out"]


def test_all_reduce(pgs):
    out = _run(pgs, lambda pg: (pg.allreduce([t := _x(0)]), t), "all_reduce", -1,
               lambda m: ({"op": "all_reduce", "reduce_op": "SUM", "out": [(4,)]}, [_x(m)]))
    assert torch.equal(out, _x(0) + _x(1) + _x(2))


def test_all_reduce_max(pgs):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    out = _run(pgs, lambda pg: (pg.allreduce([t := _x(0)], opts), t), "all_reduce", -1,
               lambda m: ({"op": "all_reduce", "reduce_op": "MAX", "out": [(4,)]}, [_x(m)]))
    assert torch.equal(out, _x(2))


def test_all_gather_and_into_tensor(pgs):
    outs = [[torch.empty(4) for _ in range(N)]]
    got = _run(pgs, lambda pg: (pg.allgather(outs, [_x(0)]), outs), "all_gather", -1,
               lambda m: ({"op": "all_gather", "out": _shapes(outs)}, [_x(m)]))
    assert all(torch.equal(got[0][m], _x(m)) for m in range(N))
    flat = torch.empty(N * 4)
    got = _run(pgs, lambda pg: (pg._allgather_base(flat, _x(0)), flat), "all_gather_into_tensor", -1,
               lambda m: ({"op": "all_gather_into_tensor", "out": [(N * 4,)]}, [_x(m)]))
    assert torch.equal(got, torch.cat([_x(m) for m in range(N)]))


def test_reduce_scatter_and_tensor(pgs):
    out = torch.empty(2)
    got = _run(pgs, lambda pg: (pg._reduce_scatter_base(out, _x(0, (N * 2,))), out), "reduce_scatter_tensor", -1,
               lambda m: ({"op": "reduce_scatter_tensor", "reduce_op": "SUM", "out": [(2,)]}, [_x(m, (N * 2,))]))
    assert torch.equal(got, sum(_x(m, (N * 2,)) for m in range(N))[:2])
    outs = [torch.empty(4)]
    got = _run(pgs, lambda pg: (pg.reduce_scatter(outs, [[_x(0) + k for k in range(N)]]), outs), "reduce_scatter",
               -1, lambda m: ({"op": "reduce_scatter", "reduce_op": "SUM", "out": [(4,)]}, [_x(m) + k for k in range(N)]))
    assert torch.equal(got[0], sum(_x(m) for m in range(N)))


def test_all_to_all_single_uneven(pgs):
    # member m sends (m + d + 1) rows to member d
    def splits(m):
        return [m + d + 1 for d in range(N)]

    def rows(m):
        return torch.arange(sum(splits(m)), dtype=torch.float32) + 100 * m

    out_splits0 = [m + 1 for m in range(N)]
    out = torch.empty(sum(out_splits0))
    got = _run(pgs, lambda pg: (pg.alltoall_base(out, rows(0), out_splits0, splits(0), dist.AllToAllOptions()), out),
               "all_to_all_single", -1,
               lambda m: ({"op": "all_to_all_single", "splits": splits(m), "out": [(sum(k + m + 1 for k in range(N)),)],
                           "out_splits": [k + m + 1 for k in range(N)]}, [rows(m)]))
    assert torch.equal(got, torch.cat([rows(m)[:splits(m)[0]] for m in range(N)]))


@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_from_a_real_or_a_virtual_root(pgs, root):
    def real(pg):
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        t = _x(0) if root == 0 else torch.zeros(4)
        return pg.broadcast([t], opts), t

    # only the root contributes (its recorded tensors); the others have no payload
    got = _run(pgs, real, "broadcast", root,
               lambda m: ({"op": "broadcast", "out": [(4,)]}, [_x(m)]) if m == root else None)
    assert torch.equal(got, _x(root))


def test_reduce_and_gather_to_a_real_root(pgs):
    def real_reduce(pg):
        opts = dist.ReduceOptions()
        opts.rootRank = 0
        return pg.reduce([t := _x(0)], opts), t

    got = _run(pgs, real_reduce, "reduce", 0,
               lambda m: ({"op": "reduce", "reduce_op": "SUM", "root": 0, "out": [(4,)]}, [_x(m)]))
    assert torch.equal(got, _x(0) + _x(1) + _x(2))
    outs = [[torch.empty(4) for _ in range(N)]]

    def real_gather(pg):
        opts = dist.GatherOptions()
        opts.rootRank = 0
        return pg.gather(outs, [_x(0)], opts), outs

    got = _run(pgs, real_gather, "gather", 0, lambda m: ({"op": "gather", "out": []}, [_x(m)]))
    assert all(torch.equal(got[0][m], _x(m)) for m in range(N))


def test_scatter_from_a_virtual_root(pgs):
    out = torch.empty(4)

    def real(pg):
        opts = dist.ScatterOptions()
        opts.rootRank = 2
        return pg.scatter([out], [], opts), out

    got = _run(pgs, real, "scatter", 2,
               lambda m: ({"op": "scatter", "out": [(4,)]}, [_x(10 + k) for k in range(N)]) if m == 2 else None)
    assert torch.equal(got, _x(10))


def test_barrier(pgs):
    """The real member's barrier is released only once every replayed member issued it."""
    released = threading.Event()

    def real_side():
        pgs[0].barrier(dist.BarrierOptions()).wait()
        released.set()

    t = threading.Thread(target=real_side, daemon=True)
    t.start()
    assert not released.wait(0.3)  # alone at the barrier: it waits for the replayed members
    works = [replay_server.issue(pgs[m], "barrier", m, N, -1, None, None) for m in range(1, N)]
    for w in works:
        w.wait()
    t.join(30)
    assert released.is_set() and not t.is_alive()


def test_unknown_op_is_named(pgs):
    with pytest.raises(ReplayError, match="cannot replay 'fancy_op'"):
        replay_server.issue(pgs[1], "fancy_op", 1, N, -1, ({}, [_x(1)]), None)


# -- a group's collectives are issued without waiting for the previous one ------------------------------------
class _Work:
    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def wait(self) -> bool:
        assert self.done.wait(10)
        return True


class _Timed:
    """Stands in for TimedReplay: records the gates and completions the server reports."""

    def __init__(self, n: int) -> None:
        self.collective_comm = {("g", k): 100 + k for k in range(n)}
        self.log: list[tuple[str, int]] = []

    def gate(self, comm: int) -> None:
        self.log.append(("gate", comm))

    def complete(self, comm: int) -> None:
        self.log.append(("complete", comm))


def _server(n: int, monkeypatch, in_flight: int | None = None, plan: ReplayPlan | None = None
            ) -> tuple[replay_server.ReplayServer, list[threading.Event], list[int]]:
    """A ReplayServer of one group {0 (slice), 1 (virtual)} with n all_reduces whose works complete only when
    their event is set (or of `plan`, its group "g"); `in_flight`: the plan's bound (default n); returns the
    server, the events, and the ops issued so far (their seq)."""
    from concurrent.futures import ThreadPoolExecutor

    if plan is None:
        plan = ReplayPlan(world=2, slice_ranks=[0], groups={"g": (0, 1)}, order=["g"],
                          collectives={"g": [Collective(k, "all_reduce", -1, f"k{k}") for k in range(n)]},
                          payload={}, channels=[], in_flight={"g": n if in_flight is None else in_flight})
    server = object.__new__(replay_server.ReplayServer)
    server.plan, server.pgs, server.errors, server.state = plan, {"g": {1: None}}, [], {}
    server.ops, server.timed, server.issued, server.played = 0, _Timed(n), {}, []
    server.rings = set()  # the members path (a 2-member group: never a neighbours ring)
    server.loader = ThreadPoolExecutor(max_workers=1)
    monkeypatch.setattr(server, "_build", lambda group: None, raising=False)
    done = [threading.Event() for _ in range(n)]
    issued: list[int] = []

    def fake_issue(pg, op, me, size, root, mine, root_payload):
        issued.append(len(issued))
        return _Work(done[len(issued) - 1])

    monkeypatch.setattr(replay_server, "issue", fake_issue)
    return server, done, issued


def _wait_for(cond, timeout: float = 5.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_groups_collectives_are_issued_before_the_previous_completes(monkeypatch):
    server, done, issued = _server(3, monkeypatch)
    t = threading.Thread(target=server._group, args=("g",), daemon=True)
    t.start()
    assert _wait_for(lambda: len(issued) == 3)  # all three in flight, none complete
    assert server.ops == 0 and ("complete", 100) not in server.timed.log
    for ev in reversed(done):  # gloo completes in order; the server reports in issue order whatever the order
        ev.set()
    t.join(5)
    assert not t.is_alive() and server.errors == []
    assert [c for what, c in server.timed.log if what == "complete"] == [100, 101, 102]
    assert [c for what, c in server.timed.log if what == "gate"] == [100, 101, 102]
    # what it played, op by op (`ops_table`, slices/slice=K/replay_ops.parquet): ready <= issue <= issued <= complete
    table = server.ops_table().to_pylist()
    assert [(r["kind"], r["op"], r["group_name"], r["group_seq"], r["virtual_members"]) for r in table] == \
        [("collective", "all_reduce", "g", k, 1) for k in range(3)]
    assert all(0 < r["t_ready_ns"] <= r["t_issue_ns"] <= r["t_issued_ns"] <= r["t_complete_ns"] for r in table)
    assert server.ops == 3 and server.state["group g"] == "done"


def test_at_most_the_plans_in_flight_collectives_are_outstanding(monkeypatch):
    server, done, issued = _server(3, monkeypatch, in_flight=2)
    t = threading.Thread(target=server._group, args=("g",), daemon=True)
    t.start()
    assert _wait_for(lambda: len(issued) == 2)
    assert not _wait_for(lambda: len(issued) > 2, timeout=0.3)  # the third waits for a slot
    assert server.state["group g"] == "all_reduce #2"
    done[0].set()
    assert _wait_for(lambda: len(issued) == 3 and server.ops == 1)
    done[1].set()
    done[2].set()
    t.join(5)
    assert not t.is_alive() and server.ops == 3 and server.errors == []
