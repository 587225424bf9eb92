"""`prism bench pruning`: bytes a group's all-reduce moves with and without pruning, from the protocol.

Not timed: for each group size n and number s of sandbox members (placed first, spread, last in group
order) it runs the pruned all-reduce of `prism.runtime.pruned` on one-element tensors, counts the bytes of
the messages the protocol sends, and checks the result against `semantics.reduce` bitwise. Columns, in
units of the reduced tensor's size S:

- ring: a full ring all-reduce among all n members (what runs without pruning: 2(n-1) S);
- chain: the pruned protocol (exact chain fold through the sandbox members and one compensator per run of
  virtual members, then the result to each sandbox member);
- gather: the alternative where each sandbox member folds itself and so must receive every contribution
  after the first sandbox member one by one (only the leading run can be pre-folded: a left fold does not
  re-associate).

    prism bench pruning [--sizes 2,4,8,16,32,64] [--sandbox 1,2,3]
"""

from __future__ import annotations

import argparse

import torch

from prism.runtime import semantics
from prism.runtime.pruned import PrunedGroup, individual_all_reduce_bytes, ring_all_reduce_bytes
from prism.runtime.semantics import RedOp


def placements(n: int, s: int) -> dict[str, list[int]]:
    return {"first": list(range(s)),
            "spread": sorted({(i * n) // s + (n // s) // 2 for i in range(s)}),
            "last": list(range(n - s, n))}


def row(n: int, s: int, where: str, sandbox: list[int]) -> dict:
    members = list(range(n))
    g = torch.Generator().manual_seed(n * 100 + s)
    xs = [torch.randn(1, generator=g) for _ in members]
    group = PrunedGroup(members, set(sandbox))
    out = group.all_reduce(RedOp.SUM, {m: xs[m] for m in sandbox}, {m: xs[m] for m in members if m not in sandbox})
    want = semantics.reduce(xs, RedOp.SUM)
    assert all(torch.equal(t, want) for t in out.values()), (n, sandbox)
    size = xs[0].numel() * xs[0].element_size()
    return dict(n=n, s=s, placement=where, participants=len(group.participants),
                ring=ring_all_reduce_bytes(n, size) // size, chain=group.bytes_moved() // size,
                gather=individual_all_reduce_bytes(members, set(sandbox), size) // size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism bench pruning", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="2,4,8,16,32,64", help="group sizes n (comma-separated)")
    p.add_argument("--sandbox", default="1,2,3", help="numbers of sandbox members s (comma-separated)")
    args = p.parse_args(argv)
    try:
        sizes = [int(v) for v in args.sizes.split(",")]
        counts = [int(v) for v in args.sandbox.split(",")]
    except ValueError:
        p.error("--sizes and --sandbox take comma-separated integers, e.g. --sizes 2,8 --sandbox 1,2")
    if any(n < 2 for n in sizes) or any(s < 1 for s in counts):
        p.error("group sizes must be >= 2 and sandbox counts >= 1")
    print(f"{'n':>4} {'s':>2} {'placement':>9} {'participants':>12} {'ring':>6} {'chain':>6} {'gather':>7} "
          f"{'chain/ring':>10}   (bytes in units of the tensor size S)")
    for n in sizes:
        for s in counts:
            if s > n:
                continue
            for where, sandbox in placements(n, s).items():
                r = row(n, s, where, sandbox)
                print(f"{r['n']:>4} {r['s']:>2} {r['placement']:>9} {r['participants']:>12} {r['ring']:>6} "
                      f"{r['chain']:>6} {r['gather']:>7} {r['chain'] / r['ring']:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
