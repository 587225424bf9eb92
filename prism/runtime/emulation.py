"""Mode `emulate`: the sandbox ranks run the real program inside a W-rank job whose other ranks are replayed.

Rank side (`EmulateTransport`, one per group the sandbox rank belongs to). A group's collectives run among
its *participants*: each sandbox member, and one compensator per maximal run of consecutive virtual members
(`compensation.pruned_members`; with `--no-pruning` every virtual member is its own participant). Only
groups holding a sandbox rank exist as communicators (the sandbox rank creates only its own groups; the
worker only groups with a sandbox rank and a virtual one): one gloo instance per participant over the key
space `prism-emu/<group>/` of the job's store. Groups of sandbox members alone compute among themselves.

A collective is an exchange of contributions over the participants' gloo pairs: every participant sends
its blob (size, then bytes) to each sandbox participant, so a sandbox member receives every other one and
a compensator nothing. A sandbox member contributes its *live* tensors, a compensator the *recorded*
tensors of its run's members (from the capture's payloads). Every sandbox member then computes its outputs from all n
members' contributions with `semantics` (the very code capture mode runs: `CaptureTransport`'s completion
functions), so its result is bitwise what prism defines over its live values and the virtual ranks'
recorded ones — not the capture's result (which slice mode substitutes). The exchange runs on one thread
per group (issue order = group order, as on a real backend), so async ops stay async. Point-to-point
messages go straight over the participants' gloo pair, with a tag that names (tag, sender, receiver).

Worker side (`serve`): one process for every virtual rank, forked by the zygote. It reads the capture's
plan (`replay.load_plan`: groups, collectives in group order, payload index, messages), creates the
compensators of every group with a sandbox member, and replays: per group one thread issues each
collective for all its compensators; per message channel (sandbox <-> virtual) one thread sends recorded
payloads / receives. Payloads are loaded ahead through `prefetch.PayloadPool` (`--prefetch-mb`).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Work

from prism.runtime import compensation, shm
from prism.runtime.capture_transport import CaptureTransport
from prism.runtime.transport import job_store

EMU_PREFIX = "prism-emu"
_STATS = {"groups": 0, "communicators": 0, "bytes_sent": 0, "bytes_received": 0, "collectives": 0, "messages": 0}


class EmulationError(RuntimeError):
    """The sandbox asked for something emulation does not do (the message names it)."""


def sandbox_ranks() -> set[int]:
    return {int(r) for r in os.environ.get("PRISM_SLICE_RANKS", "").split(",") if r.strip()}


def pruning() -> bool:
    return os.environ.get("PRISM_PRUNING", "1") != "0"


def participants(members, sandbox, pruned: bool) -> list[tuple[int, list[int]]]:
    """The peers of a group's collectives: (rank, members it supplies), in group order."""
    if pruned:
        return compensation.pruned_members(list(members), set(sandbox))
    return [(m, [m]) for m in members]


def emu_store(group: str, base):
    """Group `group`'s key space on the job's store (the same in the sandbox ranks and the worker)."""
    return PrefixStore(f"{EMU_PREFIX}/{group}/", job_store(base))


def p2p_tag(tag: int, n: int, src: int, dst: int) -> int:
    """The gloo tag of a message of the program's `tag` from group rank `src` to `dst`: a compensator hosts
    several members, so its pair channel must tell them apart."""
    return (tag * n + src) * n + dst


# -- the blob a participant contributes ---------------------------------------------------------------------
def encode_parts(parts: list[tuple[int, dict, list[torch.Tensor]]]) -> bytes:
    """Contributions of some members: [(group rank, meta, tensors)] as one buffer."""
    flat = [t for _, _, ts in parts for t in ts]
    return shm.encode(flat, {"parts": [(i, meta, len(ts)) for i, meta, ts in parts]})


def decode_parts(data: bytes) -> dict[int, tuple[dict, list[torch.Tensor]]]:
    meta, flat = shm.decode(data)
    out, k = {}, 0
    for i, m, count in meta["parts"]:
        out[i] = (m, flat[k:k + count])
        k += count
    return out


COLL_TAG = 1 << 30  # gloo tags of the collectives' exchanges (p2p tags stay far below: p2p_tag)


def issue_exchange(pgs: list[ProcessGroupGloo], indices: list[int], blobs: list[bytes],
                   receivers: list[int]) -> dict[int, bytes]:
    """One collective's contributions: each participant instance in `pgs` (participant `indices[k]` of the
    group, all held by this process) sends its blob to every sandbox participant (`receivers`) but itself;
    a sandbox participant (one instance) receives every other participant's blob. Compensators receive
    nothing (their outputs would be discarded). Returns {participant: blob} (a receiver: all of them)."""
    if not pgs:
        return {0: blobs[0]}
    keep, works = [], []
    for pg, me, blob in zip(pgs, indices, blobs):
        data = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([len(blob)], dtype=torch.int64)
        keep += [data, size]
        for r in receivers:
            if r != me:
                works.append(pg.send([size], r, COLL_TAG))
                if len(blob):
                    works.append(pg.send([data], r, COLL_TAG + 1))
                _STATS["bytes_sent"] += len(blob)
    got = {me: blob for me, blob in zip(indices, blobs)}
    if len(pgs) == 1 and indices[0] in receivers:
        pg, me = pgs[0], indices[0]
        others = [j for j in range(pg.size()) if j != me]
        sizes = {j: torch.empty(1, dtype=torch.int64) for j in others}
        for w in [pg.recv([sizes[j]], j, COLL_TAG) for j in others]:
            w.wait()
        bufs = {j: torch.empty(int(sizes[j].item()), dtype=torch.uint8) for j in others}
        for w in [pg.recv([bufs[j]], j, COLL_TAG + 1) for j in others if bufs[j].numel()]:
            w.wait()
        for j in others:
            got[j] = bytes(bufs[j].numpy())
            _STATS["bytes_received"] += bufs[j].numel()
    for w in works:
        w.wait()
    return got


# -- rank side ---------------------------------------------------------------------------------------------
class _Reader:
    """What `CaptureTransport`'s completion functions read (`c.read(key, "-r<i>")`), from an exchange."""

    def __init__(self, owner: "EmulateTransport") -> None:
        self.owner = owner

    def read(self, key: tuple, suffix: str):
        return self.owner.got[key][int(suffix.removeprefix("-r"))]


class _EmuWork(Work):
    """An emulated collective in flight: its exchange and completion run on the group's thread."""

    def __init__(self, future: torch.futures.Future, result) -> None:
        super().__init__()
        self.future, self._result = future, result

    def wait(self, timeout=None) -> bool:
        self.future.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future

    def is_completed(self) -> bool:
        return self.future.done()

    def is_success(self) -> bool:
        return self.future.done()

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self) -> None:
        self.wait()


class _SourceWork(Work):
    """A recv's work that also says who sent (what `recv_anysource` answers)."""

    def __init__(self, inner: Work, src: int) -> None:
        super().__init__()
        self._inner, self._src = inner, src

    def wait(self, timeout=None) -> bool:
        return self._inner.wait()

    def get_future(self) -> torch.futures.Future:
        return self._inner.get_future()

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def result(self):
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def _source_rank(self) -> int:
        return self._src


class EmulateTransport(CaptureTransport):
    """The transport of one group of a sandbox rank (see the module doc)."""

    def __init__(self, store, group_name: str, group_rank: int, members: list[int],
                 timeout: timedelta | None) -> None:
        self.group = group_name
        self.me = group_rank
        self.members = tuple(members)
        self.n = len(members)
        self.seq = 0
        self.sent, self.received, self.received_any = {}, {}, {}
        _STATS["groups"] += 1
        self.parts = participants(self.members, sandbox_ranks(), pruning())
        self.host = {m: i for i, (_, run) in enumerate(self.parts) for m in run}  # member -> participant
        self.index = self.host[self.members[self.me]]
        sandbox = sandbox_ranks()
        self.receivers = [i for i, (r, _) in enumerate(self.parts) if r in sandbox]
        self.pg = None
        if len(self.parts) > 1:
            self.pg = ProcessGroupGloo(PrefixStore("gloo/", emu_store(group_name, store)), self.index,
                                       len(self.parts), timeout or timedelta(minutes=30))
            _STATS["communicators"] += 1
        self.got: dict[tuple, dict] = {}
        self.c = _Reader(self)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"prism-emu-g{group_name}")

    def _keep(self, key, outputs, work_id) -> None:  # nothing is kept: the values are this run's
        pass

    def _inputs(self, key: tuple, members=None):
        got = self.got[key]
        return [got[i] for i in (range(self.n) if members is None else members)]

    def _collective(self, op: str, work_id: int, mine, complete, result, meta=None, info_tensors=None,
                    reads="all"):
        key = ("c", self.group, self.seq)
        self.seq += 1
        blob = encode_parts([(self.me, dict(meta or {}, op=op), list(mine))] if mine is not None else [])
        future = torch.futures.Future()

        def run() -> None:
            try:
                got: dict = {}
                pgs = [self.pg] if self.pg is not None else []
                for data in issue_exchange(pgs, [self.index], [blob], self.receivers).values():
                    got.update(decode_parts(data))
                self.got[key] = got
                with torch.no_grad():
                    complete(key)
                del self.got[key]
                _STATS["collectives"] += 1
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(exc)
                return
            future.set_result(result)

        self._thread.submit(run)
        return _EmuWork(future, result)

    # -- point to point: straight over the participants' pair --------------------------------------------
    def _send(self, work_id, op, tensors, dst, tag):
        if self.pg is None:
            raise EmulationError(f"send within group {self.group} of one participant")
        _STATS["bytes_sent"] += sum(t.numel() * t.element_size() for t in tensors)
        _STATS["messages"] += 1
        return self.pg.send(list(tensors), self.host[self.members[dst]], p2p_tag(tag, self.n, self.me, dst))

    def _recv(self, work_id, op, tensors, src, tag):
        if self.pg is None:
            raise EmulationError(f"recv within group {self.group} of one participant")
        _STATS["bytes_received"] += sum(t.numel() * t.element_size() for t in tensors)
        _STATS["messages"] += 1
        return self.pg.recv(list(tensors), self.host[self.members[src]], p2p_tag(tag, self.n, src, self.me))

    def _recv_anysource(self, work_id, op, tensors, tag):
        """Only where one source is possible (a group of two): a recv from that member."""
        if self.n != 2:
            raise EmulationError(f"prism emulate replays a recv from any source only in groups of two (group "
                                 f"{self.group} has {self.n} members); name the source rank in the program")
        src = 1 - self.me
        return _SourceWork(self._recv(work_id, op, tensors, src, tag), src)


def write_rank_stats(rank: int) -> None:
    """At the sandbox rank's end: its transports' numbers, for meta.json (`emulation`)."""
    folder = os.environ.get("PRISM_STATUS_DIR")
    if folder and _STATS["groups"]:  # (not in the zygote, which has no groups)
        path = Path(folder) / f"emulate-rank{rank}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(_STATS))
        os.replace(tmp, path)
