"""Synthetic raw streams for the analysis tests: what the runtime would record for a small job.

`megatron_job` builds the events of a Megatron-style program (TP fastest, then DP, then PP) with sync and
async collectives, pipeline send/recv, a rooted broadcast, waits and markers; tests mutate the resulting
`RawJob` (drop or edit events) and `write` it as ``DIR/raw/rank=R/{events,groups}.arrow`` + ``meta.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.ipc as ipc

from prism import schemas

Event = dict


@dataclass
class RawJob:
    world: int
    groups: list[dict] = field(default_factory=list)  # name, desc, members, backend
    events: list[list[Event]] = field(default_factory=list)
    nodes: dict[str, str] | None = None
    run_id: str = "testrun"  # what the launcher writes into raw/meta.json
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.events = [[] for _ in range(self.world)]
        self._clock = [0] * self.world
        self._iteration = [0] * self.world
        self._work = [0] * self.world
        self._group_seq: dict[tuple[int, str], int] = {}

    # -- recording ---------------------------------------------------------------------------------
    def group(self, desc: str | None, members: list[int], name: str | None = None) -> str:
        name = name if name is not None else str(len(self.groups))
        self.groups.append({"group_name": name, "group_desc": desc, "members": list(members), "backend": "gloo"})
        return name

    def _event(self, rank: int, kind: str, op: str, duration: int = 1_000, **values) -> Event:
        start = self._clock[rank]
        self._clock[rank] += duration
        event = {
            "rank": rank, "seq": len(self.events[rank]), "kind": kind, "op": op, "group_name": None,
            "group_seq": -1, "peer": -1, "tag": 0, "bytes": 0, "dtype": None, "shape": None,
            "is_async": False, "work_id": -1, "iteration": self._iteration[rank], "microbatch": -1,
            "t_start_ns": start, "t_end_ns": start + duration, "cpu_ns": duration, "device_ns": duration,
            "t_complete_ns": -1, "mem_bytes": -1, "mem_peak_bytes": -1, "mem_reserved_bytes": -1, "stream": 0,
        }
        event.update(values)
        self.events[rank].append(event)
        return event

    def _work_id(self, rank: int) -> int:
        self._work[rank] += 1
        return self._work[rank] - 1

    def compute(self, rank: int, duration: int = 5_000) -> None:
        self._event(rank, schemas.KIND_COMPUTE, "compute", duration)

    def marker(self, rank: int, op: str) -> None:
        self._event(rank, schemas.KIND_MARKER, op, 0)
        if op == "iteration_end":
            self._iteration[rank] += 1

    def collective(self, group: str, op: str, nbytes: int, root: int = -1, is_async: bool = False) -> dict[int, int]:
        """The op on every member of `group`; returns rank -> work_id (for waits)."""
        members = next(g["members"] for g in self.groups if g["group_name"] == group)
        works = {}
        for rank in members:
            seq = self._group_seq.get((rank, group), 0)
            self._group_seq[rank, group] = seq + 1
            works[rank] = self._work_id(rank)
            self._event(
                rank, schemas.KIND_COLLECTIVE, op, 2_000, group_name=group, group_seq=seq, peer=root,
                bytes=nbytes, dtype="float32", shape=f"{nbytes // 4}", is_async=is_async, work_id=works[rank],
            )
        return works

    def p2p(self, rank: int, kind: str, peer: int, nbytes: int, group: str, tag: int = 0, is_async: bool = False) -> int:
        work = self._work_id(rank)
        self._event(
            rank, kind, "isend" if kind == "send" and is_async else kind, 1_500, group_name=group, peer=peer,
            tag=tag, bytes=nbytes, dtype="float32", shape=f"{nbytes // 4}", is_async=is_async, work_id=work,
        )
        return work

    def wait(self, rank: int, work_id: int) -> None:
        self._event(rank, schemas.KIND_WAIT, "wait", 500, work_id=work_id)

    # -- editing -----------------------------------------------------------------------------------
    def drop(self, rank: int, predicate: Callable[[Event], bool]) -> list[Event]:
        """Remove rank's events matching `predicate` (and the waits on them); renumber seq."""
        dropped = [e for e in self.events[rank] if predicate(e)]
        works = {e["work_id"] for e in dropped if e["kind"] != schemas.KIND_WAIT and e["work_id"] >= 0}
        kept = [
            e for e in self.events[rank]
            if not predicate(e) and not (e["kind"] == schemas.KIND_WAIT and e["work_id"] in works)
        ]
        for seq, event in enumerate(kept):
            event["seq"] = seq
        self.events[rank] = kept
        return dropped

    def find(self, rank: int, **match) -> list[Event]:
        return [e for e in self.events[rank] if all(e[k] == v for k, v in match.items())]

    # -- writing -----------------------------------------------------------------------------------
    def write(self, job_dir: str | Path, batches: int = 2) -> Path:
        """Write the raw folder ``job_dir/raw`` and return it."""
        raw = Path(job_dir) / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        meta = {
            "world_size": self.world, "mode": "real", "hostname": "testhost", "command": ["train.py"],
            "torch_version": "2.13.0", "schema_version": schemas.SCHEMA_VERSION, "run_id": self.run_id,
            "device": self.device,
        }
        if self.nodes is not None:
            meta["nodes"] = self.nodes
        (raw / "meta.json").write_text(json.dumps(meta))
        for rank in range(self.world):
            folder = raw / f"rank={rank}"
            folder.mkdir(exist_ok=True)
            table = pa.Table.from_pylist(self.events[rank], schema=schemas.RAW_EVENTS)
            size = max(1, -(-table.num_rows // batches))
            with ipc.new_stream(folder / "events.arrow", schemas.RAW_EVENTS) as writer:
                for batch in table.to_batches(max_chunksize=size):
                    writer.write_batch(batch)
            rows = [{"rank": rank, **g} for g in self.groups if rank in g["members"]]
            with ipc.new_stream(folder / "groups.arrow", schemas.RAW_GROUPS) as writer:
                writer.write_table(pa.Table.from_pylist(rows, schema=schemas.RAW_GROUPS))
        return raw


def rank_of(t: int, d: int, p: int, tp: int, dp: int) -> int:
    """Megatron rank order: TP fastest, then DP, then PP."""
    return t + tp * (d + dp * p)


def megatron_job(tp: int = 2, dp: int = 2, pp: int = 1, iterations: int = 2, descs: str = "plain") -> RawJob:
    """A tp x dp x pp job. descs: "plain" (tp/dp/pp), "mesh" (mesh_tp/...), "anon" (mesh_dim_K), "none"."""
    world = tp * dp * pp
    job = RawJob(world)
    label = {
        "plain": lambda dim, k: dim,
        "mesh": lambda dim, k: f"mesh_{dim}",
        "anon": lambda dim, k: f"mesh_dim_{k}",
        "none": lambda dim, k: None,
    }[descs]
    job.group("default_pg", list(range(world)))
    tp_group, dp_group, pp_group = {}, {}, {}
    for p in range(pp):
        for d in range(dp):
            name = job.group(label("tp", 2), [rank_of(t, d, p, tp, dp) for t in range(tp)])
            for t in range(tp):
                tp_group[rank_of(t, d, p, tp, dp)] = name
    for p in range(pp):
        for t in range(tp):
            name = job.group(label("dp", 1), [rank_of(t, d, p, tp, dp) for d in range(dp)])
            for d in range(dp):
                dp_group[rank_of(t, d, p, tp, dp)] = name
    if pp > 1:
        for d in range(dp):
            for t in range(tp):
                name = job.group(label("pp", 0), [rank_of(t, d, p, tp, dp) for p in range(pp)])
                for p in range(pp):
                    pp_group[rank_of(t, d, p, tp, dp)] = name
    tp_names = sorted(set(tp_group.values()), key=int)
    dp_names = sorted(set(dp_group.values()), key=int)
    for _ in range(iterations):
        pending: dict[int, list[int]] = {r: [] for r in range(world)}
        for r in range(world):
            job.marker(r, "fwd_begin")
        for p in range(pp):  # forward, stage by stage
            ranks = [r for r in range(world) if r // (tp * dp) == p]
            for r in ranks:
                if p > 0:
                    job.p2p(r, "recv", r - tp * dp, 16_384, pp_group[r], tag=1)
                job.compute(r)
            for name in tp_names:
                if job_members(job, name)[0] in ranks:
                    job.collective(name, "all_reduce", 4_096)
            for r in ranks:
                tp_rank = r % tp
                if tp > 1 and tp_rank == 0:  # a halo exchange inside the TP group: async isend + wait
                    pending[r].append(job.p2p(r, "send", r + 1, 1_024, tp_group[r], tag=7, is_async=True))
                elif tp > 1 and tp_rank == 1:
                    job.p2p(r, "recv", r - 1, 1_024, tp_group[r], tag=7)
                if p < pp - 1:
                    pending[r].append(job.p2p(r, "send", r + tp * dp, 16_384, pp_group[r], tag=1, is_async=True))
                job.marker(r, "fwd_end")
        for p in reversed(range(pp)):  # backward
            ranks = [r for r in range(world) if r // (tp * dp) == p]
            for r in ranks:
                job.marker(r, "bwd_begin")
                if p < pp - 1:
                    job.p2p(r, "recv", r + tp * dp, 16_384, pp_group[r], tag=2)
                job.compute(r, 8_000)
            for name in dp_names:
                if job_members(job, name)[0] in ranks:
                    for r, work in job.collective(name, "all_reduce", 8_192, is_async=True).items():
                        pending[r].append(work)
            for name in tp_names:
                if job_members(job, name)[0] in ranks:
                    job.collective(name, "broadcast", 256, root=job_members(job, name)[0])
            for r in ranks:
                if p > 0:
                    job.p2p(r, "send", r - tp * dp, 16_384, pp_group[r], tag=2)
                job.compute(r, 1_000)
                for work in pending[r]:
                    job.wait(r, work)
                job.marker(r, "bwd_end")
                job.marker(r, "iteration_end")
    return job


def job_members(job: RawJob, name: str) -> list[int]:
    return next(g["members"] for g in job.groups if g["group_name"] == name)
