"""The replay plan: what a process standing in for the virtual ranks must replay, read from a capture.

Shared by the slice mode's replay server (`prism.runtime.slice.replay_server`) and the emulate mode's worker
(`prism.runtime.emulate.worker`): `load_plan(capture, ranks)` reads the capture's groups, collectives (in
group order) and point-to-point channels that involve one of `ranks` (the real ranks: the slice, the
sandbox) and a virtual rank, the payload index of the ranks that take part, and per group the most of its
collectives a real member had issued and not yet completed at once (`in_flight`, from the capture's program
order: `peak_in_flight`).

Inputs (the capture folder, `prism launch --mode capture --out DIR`): `raw/meta.json`,
`raw/rank=R/{groups,events,payloads}.arrow`.
"""

from __future__ import annotations

import heapq
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from prism import job_paths, schemas
from prism.runtime.ops import ROOTED
from prism.runtime.capture.client import key_name


class ReplayError(Exception):
    """The capture cannot be replayed for this slice (missing files, a payload the op needs)."""


def _read_stream(path: Path) -> pa.Table:
    if not path.is_file():
        raise ReplayError(f"{path}: missing (is this a complete capture with payloads?)")
    with pa.OSFile(str(path)) as source:
        return ipc.open_stream(source).read_all()


@dataclass
class Collective:
    seq: int
    op: str
    root: int  # group rank of the root (broadcast, reduce, gather, scatter), else -1
    key: str


@dataclass
class Channel:
    """The messages of one (group, sender, receiver, tag), in the order they were sent."""

    group: str
    src: int  # global ranks
    dst: int
    tag: int
    hashes: list[str] = field(default_factory=list)  # the sender's recorded payloads, in order


@dataclass
class ReplayPlan:
    """What the server must do for one slice."""

    world: int
    slice_ranks: list[int]
    groups: dict[str, tuple[int, ...]]  # every relevant group: name -> members (global ranks)
    order: list[str]  # relevant groups in creation order
    collectives: dict[str, list[Collective]]
    payload: dict[tuple[int, str], str]  # (global rank, key) -> hash
    channels: list[Channel]
    # group -> the most of its collectives one of `slice_ranks` had issued and not yet completed at once in
    # the capture (`peak_in_flight`; 1 for a group without collectives): the replay server keeps that many in
    # flight, so it never holds back an op the real members would already have issued
    in_flight: dict[str, int]

    def virtual(self, group: str) -> list[int]:
        return [r for r in self.groups[group] if r not in self.slice_ranks]

    def to_build(self, group: str, lazy: bool) -> list[int]:
        """The virtual members the server must create. Eager gloo waits for every member at creation: all
        of them. Lazy gloo (TORCH_GLOO_LAZY_INIT=1) connects a pair on its first op: only the members that
        communicate with a slice rank (every member if the group has collectives, else the peers of its
        messages); a group that never communicates is not created at all."""
        if not lazy or self.collectives[group]:
            return self.virtual(group)
        peers = {ch.src if ch.src not in self.slice_ranks else ch.dst for ch in self.channels if ch.group == group}
        return [r for r in self.virtual(group) if r in peers]


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def load_plan(capture: Path, slice_ranks: list[int]) -> ReplayPlan:
    """Read the capture: the groups, collectives and messages that involve a slice rank and a virtual one."""
    meta_path = job_paths.meta_path(capture)
    if not meta_path.is_file():
        raise ReplayError(f"{meta_path}: missing (not a capture folder, or the capture did not finish)")
    world = int(json.loads(meta_path.read_text())["world_size"])
    slice_set = set(slice_ranks)
    groups: dict[str, tuple[int, ...]] = {}
    # a group holding a slice rank is in that rank's groups table
    for r in slice_ranks:
        for name, members in zip(*_read_stream(job_paths.rank_stream(capture, r, "groups.arrow"))
                                 .select(["group_name", "members"]).to_pydict().values()):
            members = tuple(members)
            if any(m not in slice_set for m in members):
                groups[name] = members
    order = sorted(groups, key=_group_order)

    # the collectives of each relevant group, from one slice member's events (every member issues them all)
    collectives: dict[str, list[Collective]] = {g: [] for g in groups}
    in_flight: dict[str, int] = {g: 1 for g in groups}
    seen_by: dict[str, int] = {}
    peers: set[int] = set()
    for r in slice_ranks:
        ev = _read_stream(job_paths.rank_stream(capture, r)).select(
            ["seq", "kind", "op", "group_name", "group_seq", "peer", "work_id", "t_start_ns", "t_complete_ns"])
        cols = ev.to_pydict()
        for group, most in peak_in_flight(cols).items():
            if group in groups:
                in_flight[group] = max(in_flight[group], most)
        for kind, op, group, gseq, peer in zip(cols["kind"], cols["op"], cols["group_name"], cols["group_seq"],
                                               cols["peer"]):
            if kind in ("send", "recv") and group in groups:
                if peer < 0:  # a recv from any source records its sender once it completed
                    raise ReplayError(f"{job_paths.rank_stream(capture, r)}: a {op} without its sender "
                                      "(captured by an older prism, or never waited on): capture again")
                peers.add(peer)
            if kind != "collective" or group not in groups or seen_by.setdefault(group, r) != r:
                continue
            members = groups[group]
            root = members.index(peer) if op in ROOTED else -1
            collectives[group].append(Collective(gseq, op, root, key_name(("c", group, gseq))))
    for ops in collectives.values():
        ops.sort(key=lambda c: c.seq)

    # the payload indexes: of the slice ranks (their sends to virtual ranks, roots' shapes), of the virtual
    # members of groups with collectives, and of the virtual peers of the slice ranks' messages
    readers = set(slice_set)
    for g, ops in collectives.items():
        if ops:
            readers.update(groups[g])
    readers.update(p for p in peers if p not in slice_set)
    payload: dict[tuple[int, str], str] = {}
    channels: dict[tuple[str, int, int, int], list[tuple[int, str]]] = defaultdict(list)
    for r in sorted(readers):
        table = _read_stream(job_paths.rank_stream(capture, r, "payloads.arrow"))
        table = table.select(["key", "role", "hash"]).to_pydict()
        for key, role, digest in zip(table["key"], table["role"], table["hash"]):
            if role != "in":  # results kept for the slice ranks themselves (prism.runtime.slice.transport)
                continue
            if key.startswith("c-"):
                payload[(r, key)] = digest
                continue
            # p2p key: p-<group>-<src>-<dst>-<tag>-<k>
            group, src, dst, tag, k = _split_p2p(key)
            if group not in groups or (src in slice_set) == (dst in slice_set):
                continue
            channels[(group, src, dst, tag)].append((k, digest))
    chans = []
    for (group, src, dst, tag), items in sorted(channels.items()):
        items.sort()
        chans.append(Channel(group, src, dst, tag, [h for _, h in items]))
    return ReplayPlan(world, list(slice_ranks), groups, order, collectives, payload, chans, in_flight)


def peak_in_flight(events: dict[str, list]) -> dict[str, int]:
    """Per group: the most of its collectives one rank had issued and not yet completed at once.

    `events`: one rank's raw events (columns seq, kind, group_name, work_id, t_start_ns, t_complete_ns). Counted
    in program order, not on the capture's clock (a capture runs at its own pace): an op is outstanding from
    its event until the program's wait on it (its `wait` event, same work_id), which no op of the real job
    passes before the op completed, so the count bounds what the real member had in flight. An op never waited
    on (consumed through its future) is outstanding until the first event that starts after its recorded
    completion, and one with neither, to the end of the rank's events."""
    order = sorted(range(len(events["seq"])), key=events["seq"].__getitem__)
    kinds, groups, works = events["kind"], events["group_name"], events["work_id"]
    waited = {works[i] for i in order if kinds[i] == schemas.KIND_WAIT and works[i] >= 0}
    open_ops: dict[int, str] = {}  # work_id -> group
    by_completion: list[tuple[int, int]] = []  # (t_complete_ns, work_id) of the ops never waited on, a heap
    count: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)

    def close(work: int) -> None:
        group = open_ops.pop(work, None)
        if group is not None:
            count[group] -= 1

    for i in order:
        while by_completion and by_completion[0][0] <= events["t_start_ns"][i]:
            close(heapq.heappop(by_completion)[1])
        if kinds[i] == schemas.KIND_WAIT:
            close(works[i])
        elif kinds[i] == schemas.KIND_COLLECTIVE and groups[i] is not None:
            group = groups[i]
            peak[group] = max(peak[group], count[group] + 1)
            if works[i] < 0:  # no work to wait on: complete when issued
                continue
            open_ops[works[i]] = group
            count[group] += 1
            if works[i] not in waited and events["t_complete_ns"][i] >= 0:
                heapq.heappush(by_completion, (events["t_complete_ns"][i], works[i]))
    return dict(peak)


def _split_p2p(key: str) -> tuple[str, int, int, int, int]:
    head, src, dst, tag, k = key.rsplit("-", 4)
    return head[2:], int(src), int(dst), int(tag), int(k)
