"""Bundles: the sets of ranks that the sweep advances in lockstep (see `prism.calibrate.sweep`).

A bundle is a set of ranks with identical code sequences that share collectives (a TP group, or a whole
pipeline stage of identical DP replicas). `bundles` finds them (union-find over the ranks that meet in a
collective, then a check that their codes are equal); `split` breaks the bundles that blocked into single
ranks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from prism.calibrate.arrays import ARRIVE, SweepGraph


@njit(cache=True)
def _signatures(rank_ptr, code):
    """FNV-1a hash of every rank's code sequence."""
    w = len(rank_ptr) - 1
    out = np.empty(w, dtype=np.uint64)
    prime = np.uint64(1099511628211)
    for r in range(w):
        h = np.uint64(14695981039346656037)
        for e in range(rank_ptr[r], rank_ptr[r + 1]):
            h = (h ^ np.uint64(code[e] + 1)) * prime
        out[r] = h
    return out


@njit(cache=True)
def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@njit(cache=True)
def _bundle_roots(rank_ptr, code, link, comm_p2p, sig):
    """Union of ranks with the same signature and length that share a collective; root per rank."""
    w = len(rank_ptr) - 1
    parent = np.arange(w)
    first = np.full(len(comm_p2p), -1, dtype=np.int64)
    for r in range(w):
        n_r = rank_ptr[r + 1] - rank_ptr[r]
        for e in range(rank_ptr[r], rank_ptr[r + 1]):
            if code[e] < ARRIVE:  # not an arrival (`arrays`: the codes' order)
                continue
            c = link[e]
            if comm_p2p[c]:
                continue
            f = first[c]
            if f < 0:
                first[c] = r
            elif sig[f] == sig[r] and rank_ptr[f + 1] - rank_ptr[f] == n_r:
                a = _find(parent, f)
                b = _find(parent, r)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    for r in range(w):
        parent[r] = _find(parent, r)
    return parent


@njit(cache=True)
def _same_codes(rank_ptr, code, lane_ptr, lane_rank):
    """bool per lane: its code sequence equals its bundle's first lane's (guards hash collisions)."""
    ok = np.ones(len(lane_rank), dtype=np.bool_)
    for b in range(len(lane_ptr) - 1):
        r0 = lane_rank[lane_ptr[b]]
        b0 = rank_ptr[r0]
        n0 = rank_ptr[r0 + 1] - b0
        for l in range(lane_ptr[b] + 1, lane_ptr[b + 1]):
            r = lane_rank[l]
            if rank_ptr[r + 1] - rank_ptr[r] != n0:
                ok[l] = False
                continue
            base = rank_ptr[r]
            for k in range(n0):
                if code[base + k] != code[b0 + k]:
                    ok[l] = False
                    break
    return ok


def bundles(graph: SweepGraph, code: np.ndarray, link: np.ndarray, bundle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(lane_ptr int64[B+1], lane_rank int64[W]): the bundles, each one's ranks in increasing order."""
    w = graph.n_ranks
    if not bundle or w == 0:
        return np.arange(w + 1, dtype=np.int64), np.arange(w, dtype=np.int64)
    roots = _bundle_roots(graph.rank_ptr, code, link, graph.comm_p2p, _signatures(graph.rank_ptr, code))
    lane_rank = np.argsort(roots, kind="stable").astype(np.int64)  # roots are each bundle's smallest rank
    sorted_roots = roots[lane_rank]
    starts = np.flatnonzero(np.r_[True, sorted_roots[1:] != sorted_roots[:-1]])
    lane_ptr = np.r_[starts, w].astype(np.int64)
    ok = _same_codes(graph.rank_ptr, code, lane_ptr, lane_rank)
    if ok.all():
        return lane_ptr, lane_rank
    # a hash collision: the odd lanes become bundles of their own
    return split(lane_ptr, lane_rank, lane_rank[~ok])


def split(lane_ptr: np.ndarray, lane_rank: np.ndarray, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bundles with `ranks` taken out, each into a bundle of its own (bundles ordered by first rank)."""
    out = set(ranks.tolist())
    groups: list[list[int]] = []
    for b in range(len(lane_ptr) - 1):
        lanes = lane_rank[lane_ptr[b] : lane_ptr[b + 1]].tolist()
        kept = [r for r in lanes if r not in out]
        groups += ([kept] if kept else []) + [[r] for r in lanes if r in out]
    groups.sort(key=lambda g: g[0])
    new_rank = np.array([r for g in groups for r in g], dtype=np.int64)
    new_ptr = np.r_[0, np.cumsum([len(g) for g in groups])].astype(np.int64)
    return new_ptr, new_rank
