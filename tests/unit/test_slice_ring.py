"""The neighbours ring's schedule (`prism.runtime.slice.ring`) against a plain simulation of an N-member ring
all-reduce, and the server's played chunks against what the simulated run's last member sends."""

from __future__ import annotations

import threading

import pytest
import torch

from prism import settings
from prism.runtime import semantics
from prism.runtime.slice import ring


def simulate(contribs: list[torch.Tensor], op) -> tuple[list[torch.Tensor], dict]:
    """Every member runs the schedule; returns each member's result and what each member sent at each step
    (member, step) -> (chunk index, value, the members whose contributions it holds)."""
    n = len(contribs)
    bufs = [ring.chunks(c.clone().reshape(-1), n) for c in contribs]
    held = [[{m} for _ in range(n)] for m in range(n)]  # who each member's chunk c holds
    sent = {}
    for j in range(ring.steps(n)):
        msgs = []
        for m in range(n):
            c = ring.sent_chunk(m, j, n)
            msgs.append((c, bufs[m][c].clone(), set(held[m][c])))
            sent[(m, j)] = msgs[-1]
        for m in range(n):
            c, value, who = msgs[(m - 1) % n]
            assert c == ring.received_chunk(m, j, n)
            if j < n - 1:
                semantics.fold_into(bufs[m][c], value, op)
                held[m][c] |= who
            else:
                bufs[m][c].copy_(value)
                held[m][c] = set(who)
    return [torch.cat(b) for b in bufs], sent


@pytest.mark.parametrize("n,numel", [(3, 10), (4, 12929 // 4), (5, 3), (8, 1), (7, 100)])
def test_the_schedule_is_an_all_reduce_and_partials_hold_the_named_members(n, numel):
    gen = torch.Generator().manual_seed(n)
    contribs = [torch.randint(-50, 50, (numel,), generator=gen) for _ in range(n)]
    results, sent = simulate(contribs, semantics.RedOp.SUM)
    want = torch.stack(contribs).sum(0)
    for r in results:
        assert torch.equal(r, want)
    for (m, j), (c, _, who) in sent.items():
        assert who == set(ring.partial_positions(m, j, n)), (m, j)


def test_runs_between_slice_ranks():
    assert ring.runs(8, [0]) == [(0, 0)]
    assert ring.runs(8, [0, 1]) == [(1, 0)]  # 0 -> 1 directly; the run 2..7 from 1 back to 0
    assert ring.runs(8, [1, 3]) == [(1, 3), (3, 1)]
    assert ring.runs(8, [0, 7]) == [(0, 7)]  # 7 -> 0 wraps directly
    assert ring.runs(4, [0, 1, 2, 3]) == []


class FakePG:
    """Records the server's sends; answers its receives at once."""

    def __init__(self):
        self.sends: list[tuple[int, torch.Tensor]] = []
        self.recvs: list[tuple[int, int]] = []

    class _Done:
        def wait(self):
            return True

    def send(self, tensors, dst, tag):
        self.sends.append((dst, tensors[0].clone()))
        return self._Done()

    def recv(self, tensors, src, tag):
        self.recvs.append((src, tensors[0].numel()))
        return self._Done()


@pytest.mark.parametrize("n,live,numel,op", [(6, [0], 20, "SUM"), (8, [1, 3], 9, "MAX"), (8, [0, 7], 17, "BXOR"),
                                             (5, [2], 3, "SUM")])
def test_the_server_sends_what_the_runs_last_member_sends(n, live, numel, op):
    gen = torch.Generator().manual_seed(numel)
    contribs = [torch.randint(0, 1 << 20, (numel,), generator=gen) for _ in range(n)]
    red = getattr(semantics.RedOp, op)
    _, sent = simulate(contribs, red)
    pg = FakePG()
    ring.play(pg, n, live, 0, contribs[live[0]], red, dict(enumerate(contribs)))
    index = {p: i for i, p in enumerate(live)}
    want = []  # per run, in step order: (slice rank index, value) of every non-empty chunk member b-1 sends
    for a, b in ring.runs(n, live):
        want.append([(index[b], sent[((b - 1) % n, j)][1]) for j in range(ring.steps(n))
                     if sent[((b - 1) % n, j)][1].numel()])
    got = {}
    for dst, value in pg.sends:
        got.setdefault(dst, []).append(value)
    for run in want:
        dst = run[0][0]
        assert len(got[dst]) == len(run)
        for (_, w), g in zip(run, got[dst]):
            assert torch.equal(w, g)
    received = sum(1 for a, _ in ring.runs(n, live) for j in range(ring.steps(n))
                   if sent[(a, j)][1].numel())
    assert len(pg.recvs) == received


def test_floats_get_zeros_of_the_rings_sizes():
    pg = FakePG()
    ring.play(pg, 4, [0], 0, torch.ones(10), semantics.RedOp.SUM, None)
    assert [v.numel() for _, v in pg.sends] == [ring.chunks(torch.empty(10), 4)[ring.sent_chunk(3, j, 4)].numel()
                                               for j in range(6)]
    assert all(not v.any() for _, v in pg.sends)


def test_the_setting_takes_two_values(monkeypatch):
    monkeypatch.setenv(settings.SLICE_RING.name, "fast")
    with pytest.raises(ring.RingError, match="PRISM_SLICE_RING='fast'"):
        ring.enabled()
    monkeypatch.setenv(settings.SLICE_RING.name, "members")
    assert not ring.enabled()
    monkeypatch.delenv(settings.SLICE_RING.name)
    monkeypatch.setenv(settings.DEVICE.name, "cuda")
    assert not ring.enabled()  # the members path on CUDA
    monkeypatch.setenv(settings.DEVICE.name, "cpu")
    assert ring.enabled()


def test_averaging_is_refused():
    with pytest.raises(ring.RingError, match="AVG"):
        ring.reduce_into(torch.ones(2), torch.ones(2), semantics.RedOp.AVG)


# -- the slice rank's steps (`LiveRing._ring`) over an in-process network -------------------------------------
class Net:
    """Messages by (src, dst, tag), in order, as a gloo pair matches an unbound buffer's sends and receives;
    every post and wait logged per member."""

    def __init__(self):
        self.cv = threading.Condition()
        self.queues: dict[tuple, list] = {}
        self.log: dict[int, list] = {}

    def pg(self, rank: int) -> "NetPG":
        return NetPG(self, rank)


class NetPG:
    def __init__(self, net: Net, rank: int):
        self.net, self.rank = net, rank
        self.sends = self.recvs = 0
        net.log[rank] = []

    def _event(self, *what):
        self.net.log[self.rank].append(what)

    def send(self, tensors, dst, tag):
        t = tensors[0]
        k, self.sends = self.sends, self.sends + 1
        snapshot = t.clone()
        with self.net.cv:
            self.net.queues.setdefault((self.rank, dst, tag), []).append(snapshot)
            self.net.cv.notify_all()
        self._event("post send", k, dst, t.numel())
        pg = self

        class W:
            def wait(self):
                # a real send reads its buffer until it completes: the chunk must not have changed meanwhile
                assert torch.equal(t, snapshot), f"member {pg.rank}: send #{k}'s chunk was written before it completed"
                pg._event("wait send", k)
                return True
        return W()

    def recv(self, tensors, src, tag):
        t = tensors[0]
        k, self.recvs = self.recvs, self.recvs + 1
        self._event("post recv", k, src, t.numel())
        pg = self

        class W:
            def wait(self):
                pg._event("wait recv", k)
                with pg.net.cv:
                    q = pg.net.queues.setdefault((src, pg.rank, tag), [])
                    assert pg.net.cv.wait_for(lambda: q, timeout=10), f"member {pg.rank}: recv #{k} never came"
                    value = q.pop(0)
                assert value.numel() == t.numel(), (pg.rank, k, value.numel(), t.numel())
                t.copy_(value)
                return True
        return W()


def _live(net: Net, n: int, m: int) -> ring.LiveRing:
    lr = object.__new__(ring.LiveRing)  # (no gloo group: the ring's steps over `net`)
    lr.n, lr.pos, lr.pg = n, m, net.pg(m)
    lr.left, lr.right = (m - 1) % n, (m + 1) % n
    lr._local = threading.local()
    return lr


def _run_all(n: int, tensors: list[torch.Tensor], op, ops: int = 1) -> Net:
    net = Net()
    lives = [_live(net, n, m) for m in range(n)]
    errors = []

    def go(m):
        try:
            for tag in range(ops):
                lives[m]._ring(tensors[m][tag], op, tag)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(m,)) for m in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return net


@pytest.mark.parametrize("n,numel,op", [(3, 10, "SUM"), (4, 12929 // 4, "SUM"), (5, 3, "MAX"), (3, 2, "SUM"),
                                        (7, 100, "BXOR"), (4, 65536, "SUM")])
def test_the_slice_ranks_steps_are_the_rings_and_exact(n, numel, op):
    """Every member running `LiveRing._ring`: each one's result is the exact reduction, and its messages are the
    N-ring's (step j: one chunk of the ring's sizes to the right, one from the left, none for an empty chunk),
    with two ops in a row on the same thread (its kept buffers) and a non-contiguous tensor."""
    red = getattr(semantics.RedOp, op)
    gen = torch.Generator().manual_seed(numel + n)
    contribs = [[torch.randint(0, 1 << 20, (numel,), generator=gen) for _ in range(2)] for _ in range(n)]
    tensors = [[c.clone() for c in cs] for cs in contribs]
    if numel == 100:  # a non-contiguous tensor (a transposed 10x10)
        tensors = [[c.clone().reshape(10, 10).t() for c in cs] for cs in contribs]
    net = _run_all(n, tensors, red, ops=2)
    for k in range(2):
        want = [c[k] for c in contribs]
        acc = want[0].clone()
        for w in want[1:]:
            semantics.fold_into(acc, w, red)
        for m in range(n):
            got = tensors[m][k].t().reshape(-1) if numel == 100 else tensors[m][k]
            assert torch.equal(got, acc), (m, k)
    sizes = [c.numel() for c in ring.chunks(torch.empty(numel), n)]
    for m in range(n):
        sends = [(e[2], e[3]) for e in net.log[m] if e[0] == "post send"]
        recvs = [(e[2], e[3]) for e in net.log[m] if e[0] == "post recv"]
        one_s = [((m + 1) % n, sizes[ring.sent_chunk(m, j, n)]) for j in range(ring.steps(n))
                 if sizes[ring.sent_chunk(m, j, n)]]
        one_r = [((m - 1) % n, sizes[ring.received_chunk(m, j, n)]) for j in range(ring.steps(n))
                 if sizes[ring.received_chunk(m, j, n)]]
        assert sends == one_s * 2 and recvs == one_r * 2, m
