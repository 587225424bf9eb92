"""PrunedGroup: every collective kind's sandbox outputs equal `semantics` over all members; messages counted."""

import random

import pytest
import torch

from prism.runtime import semantics
from prism.runtime.emulate.pruned import PrunedGroup, individual_all_reduce_bytes, ring_all_reduce_bytes
from prism.runtime.semantics import RedOp

_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(_BITS[a.element_size()]),
                                                                      b.view(_BITS[b.element_size()]))


def case(seed, dtype=torch.float32, numel=12):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    n = rng.randint(2, 9)
    members = rng.sample(range(100), n)
    sandbox = set(rng.sample(members, rng.randint(1, n)))
    scale = lambda: 10.0 ** torch.randint(-5, 6, (numel,), generator=g)
    recorded = {m: (torch.randn(numel, generator=g, dtype=torch.float64) * scale()).to(dtype) for m in members}
    live = {m: (torch.randn(numel, generator=g, dtype=torch.float64) * scale()).to(dtype) for m in sandbox}
    full = [live.get(m, recorded[m]) for m in members]
    return members, sandbox, live, {m: t for m, t in recorded.items() if m not in sandbox}, full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_reductions_equal_semantics_bitwise(dtype):
    for seed in range(25):
        members, sandbox, live, rec, full = case(seed, dtype, numel=2520)   # divisible by n = 2..9
        for op in [RedOp.SUM, RedOp.AVG, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX]:
            want = semantics.reduce(full, op)
            g = PrunedGroup(members, sandbox)
            out = g.all_reduce(op, live, rec)
            assert set(out) == sandbox and all(same_bits(t, want) for t in out.values()), (seed, op)
            root = sorted(sandbox)[0]
            red = PrunedGroup(members, sandbox).reduce(op, root, live, rec)
            assert same_bits(red[root], want) and all(red[r] is None for r in sandbox - {root})
            rs = PrunedGroup(members, sandbox).reduce_scatter(op, live, rec)
            for r, t in rs.items():
                want_c = semantics.reduce_scatter_chunk(full, op, members.index(r), len(members))
                assert same_bits(t, want_c), (seed, op, r)


def test_data_movement_kinds_equal_semantics():
    for seed in range(20):
        members, sandbox, live, rec, full = case(seed)
        n = len(members)
        ag = PrunedGroup(members, sandbox).all_gather(live, rec)
        assert all(all(torch.equal(a, b) for a, b in zip(v, full)) for v in ag.values())
        dst = sorted(sandbox)[-1]
        ga = PrunedGroup(members, sandbox).gather(dst, live, rec)
        assert all(torch.equal(a, b) for a, b in zip(ga[dst], full))
        for src in (members[0], members[-1]):
            bc = PrunedGroup(members, sandbox).broadcast(src, live, rec)
            assert all(torch.equal(t, full[members.index(src)]) for t in bc.values())
            lists = {m: list(torch.arange(float(n * 2)).reshape(n, 2) + m) for m in members}
            sc = PrunedGroup(members, sandbox).scatter(src, {m: lists[m] for m in sandbox},
                                                       {m: lists[m] for m in members if m not in sandbox})
            assert all(torch.equal(t, lists[src][members.index(r)]) for r, t in sc.items())
        rows = [torch.arange(float(n * 3 * (i + 1))).reshape(n * (i + 1), 3) for i in range(n)]
        splits = {m: [i + 1] * n for i, m in enumerate(members)}
        a2a = PrunedGroup(members, sandbox).all_to_all_single(
            splits, {m: rows[i] for i, m in enumerate(members) if m in sandbox},
            {m: rows[i] for i, m in enumerate(members) if m not in sandbox})
        for r, t in a2a.items():
            assert torch.equal(t, semantics.all_to_all_single(rows, [splits[m] for m in members], members.index(r)))


def test_chain_messages_hand_counted():
    # 8 members, sandbox {3, 5}: participants 0[0,1,2] -> 3 -> 4[4] -> 5 -> 6[6,7]; 4 links, then the
    # result from 6 to 3 and 5: 6 messages of 40 bytes (10 float32).
    members = list(range(8))
    rec = {m: torch.ones(10) for m in members if m not in (3, 5)}
    g = PrunedGroup(members, {3, 5})
    g.all_reduce(RedOp.SUM, {3: torch.ones(10), 5: torch.ones(10)}, rec)
    assert g.messages == [(0, 3, 40), (3, 4, 40), (4, 5, 40), (5, 6, 40), (6, 3, 40), (6, 5, 40)]
    assert g.bytes_moved() == 240
    assert ring_all_reduce_bytes(8, 40) == 2 * 7 * 40
    # gathering instead: each of 2 sandbox members gets the prefold of [0,1,2] and members 4..7 but itself
    assert individual_all_reduce_bytes(members, {3, 5}, 40) == 2 * (1 + 4) * 40


def test_sandbox_last_member_holds_result():
    g = PrunedGroup([0, 1, 2, 3], {3})
    out = g.all_reduce(RedOp.SUM, {3: torch.tensor([1.0])}, {m: torch.tensor([1.0]) for m in range(3)})
    assert out[3].item() == 4.0 and g.messages == [(0, 3, 4)]


def test_missing_contribution_is_named():
    with pytest.raises(ValueError, match=r"sandbox ranks \[2\].*virtual ranks \[1\]"):
        PrunedGroup([0, 1, 2], {2}).all_reduce(RedOp.SUM, {}, {0: torch.ones(1)})


def test_pruning_bench_table(capsys):
    from prism.bench import pruning
    assert pruning.main(["--protocol", "--sizes", "2,8", "--sandbox", "1,2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert len(rows) == 2 * 2 * 3
    # n=8, s=2 first: participants 0, 1, [2..7]; links 0->1, 1->2 and the result 2->0, 2->1: 4 S; ring 14 S
    assert ["8", "2", "first", "3", "14", "4", "14", "0.286"] in rows
    with pytest.raises(SystemExit):
        pruning.main(["--protocol", "--sizes", "1"])
    with pytest.raises(SystemExit):
        pruning.main(["--sizes", "6"])  # emulations: W a multiple of 4


# -- the plan: hand-counted messages of the cases the runtime meets ----------------------------------------------
def _plan(op, members, sandbox, pruned=True, root=-1):
    from prism.runtime.emulate.pruned import Protocol, participants
    return Protocol(op, members, sandbox, participants(members, sandbox, pruned), root)


def test_plan_trailing_single_member_sends_its_part_to_the_last_sandbox_member():
    # [0..3], sandbox {1}: participants 0 -> 1 -> [2, 3]: the run of two takes the chain (2 links + result);
    # sandbox {2}: 0[0,1] -> 2 -> 3: member 3 sends its part to 2, which ends the chain (no result back)
    assert [(l.src, l.dst, l.what) for l in _plan("all_reduce", range(4), {1}).links] == \
        [(0, 1, "acc"), (1, 2, "acc"), (2, 1, "result")]
    assert [(l.src, l.dst, l.what) for l in _plan("all_reduce", range(4), {2}).links] == \
        [(0, 1, "acc"), (2, 1, "parts")]
    # without pruning every trailing member sends its part: 0 -> 1, then 2 and 3 to 1
    assert [(l.src, l.dst, l.what) for l in _plan("all_reduce", range(4), {1}, pruned=False).links] == \
        [(0, 1, "acc"), (2, 1, "parts"), (3, 1, "parts")]


def test_plan_moves_nothing_nobody_reads():
    assert _plan("reduce", range(4), {1}, root=0).links == []  # the root is virtual: its result is not read
    assert _plan("gather", range(4), {1}, root=3).links == []
    # all_to_all: one message per (participant, sandbox member), nothing to virtual members
    assert [(l.src, l.dst) for l in _plan("all_to_all_single", range(4), {1}).links] == [(0, 1), (2, 1)]


@pytest.mark.parametrize("pruned", [True, False])
def test_pruning_on_and_off_give_the_same_bits(pruned):
    for seed in range(15):
        members, sandbox, live, rec, full = case(seed, numel=2520)
        for op in [RedOp.SUM, RedOp.AVG]:
            out = PrunedGroup(members, sandbox, pruned=pruned).all_reduce(op, live, rec)
            assert all(same_bits(t, semantics.reduce(full, op)) for t in out.values())
            rs = PrunedGroup(members, sandbox, pruned=pruned).reduce_scatter(op, live, rec)
            for r, t in rs.items():
                assert same_bits(t, semantics.reduce_scatter_chunk(full, op, members.index(r), len(members)))


def test_bytes_on_off_hand_counted():
    """dp8, sandbox {0}, 400-byte tensors: pruned 0 -> [1..7] and the result back (800 B); unpruned every
    member 1..7 sends its part to 0 (2800 B). reduce_scatter moves only rank 0's chunk (1/8 of it)."""
    for pruned, want in ((True, 800), (False, 2800)):
        g = PrunedGroup(range(8), {0}, pruned=pruned)
        g.all_reduce(RedOp.SUM, {0: torch.ones(100)}, {m: torch.ones(100) for m in range(1, 8)})
        assert g.bytes_moved() == want
        g = PrunedGroup(range(8), {0}, pruned=pruned)
        g.reduce_scatter(RedOp.SUM, {0: torch.ones(800)}, {m: torch.ones(800) for m in range(1, 8)})
        assert g.bytes_moved() == want


def test_coalesced_and_list_kinds_through_execute():
    """all_reduce_coalesced (two tensors), reduce_scatter with a list per output, all_to_all with a list."""
    members, sandbox = [5, 6, 7, 8, 9], {6, 9}
    g = torch.Generator().manual_seed(3)
    xs = {m: [torch.randn(6, generator=g), torch.randn(3, generator=g)] for m in members}
    grp = PrunedGroup(members, sandbox)
    out = grp.execute("all_reduce_coalesced", {m: ({}, xs[m]) for m in members}, RedOp.SUM)
    for r in sandbox:
        assert all(same_bits(out[r]["result"][j], semantics.reduce([xs[m][j] for m in members], RedOp.SUM))
                   for j in range(2))
    n = len(members)
    lists = {m: [torch.randn(4, generator=g) for _ in range(2 * n)] for m in members}  # 2 outputs x n chunks
    out = PrunedGroup(members, sandbox).execute("reduce_scatter", {m: ({}, lists[m]) for m in members}, RedOp.SUM)
    for r in sandbox:
        me = members.index(r)
        for j in range(2):
            want = semantics.reduce([lists[m][j * n + me] for m in members], RedOp.SUM)
            assert same_bits(out[r]["result"][j], want)
    out = PrunedGroup(members, sandbox).execute("all_to_all", {m: ({}, lists[m][:n]) for m in members})
    for r in sandbox:
        me = members.index(r)
        assert all(torch.equal(out[r]["got"][i][1][0], lists[m][me]) for i, m in enumerate(members))


def test_gloo_wire_sends_exactly_the_plans_bytes():
    """The runtime's wire (gloo, one instance per participant, here threads of one process) carries the
    protocol: outputs bitwise `semantics`, bytes sent == the in-memory execution's message bytes."""
    import threading
    from datetime import timedelta

    from torch._C._distributed_c10d import HashStore, PrefixStore, ProcessGroupGloo

    from prism.runtime.emulate import transport as emulate_transport
    from prism.runtime.emulate import pruned

    members, sandbox = list(range(7)), {2, 4}
    parts = pruned.participants(members, sandbox)  # 0[0,1] 2 3[3] 4 5[5,6]
    g = torch.Generator().manual_seed(11)
    xs = {m: torch.randn(70, generator=g) * 10.0 ** torch.randint(-4, 5, (70,), generator=g) for m in members}
    want = semantics.reduce([xs[m] for m in members], RedOp.SUM)
    store = HashStore()
    for k, op in enumerate(["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"]):
        proto = pruned.Protocol(op, members, sandbox, parts)
        sim = PrunedGroup(members, sandbox)
        sim_out = sim.execute(op, {m: ({}, [xs[m]]) for m in members}, RedOp.SUM)
        outs, wires, errors = {}, {}, []

        def one(i):
            try:
                pg = ProcessGroupGloo(PrefixStore(f"t{k}/", store), i, len(parts), timedelta(seconds=30))
                wires[i] = emulate_transport.GlooWire(pg)
                own = {members.index(m): ({}, [xs[m]]) for m in parts[i][1]}
                outs[i] = pruned.run(proto, i, own, wires[i], RedOp.SUM)
                sent = wires[i].bytes
                wires[i].flush()
                wires[i].sent = sent
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(parts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert sum(w.sent for w in wires.values()) == sim.bytes_moved() > 0
        for i, (r, _) in enumerate(parts):
            if r not in sandbox:
                assert outs[i] is None
            elif op == "all_reduce":
                assert same_bits(outs[i]["result"][0], want) and same_bits(sim_out[r]["result"][0], want)
            elif op == "reduce_scatter_tensor":
                chunk = semantics.reduce_scatter_chunk([xs[m] for m in members], RedOp.SUM, r, 7)
                assert same_bits(outs[i]["result"][0], chunk)
            else:
                assert all(torch.equal(outs[i]["got"][j][1][0], xs[m]) for j, m in enumerate(members))
