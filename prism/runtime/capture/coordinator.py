"""The capture coordinator: P device slots, W ranks, and the collectives between them.

Pure state machine, no I/O: `handle(rank, message)` returns the replies to send; the zygote's event loop
(`zygote.supervise`) moves the bytes. A rank that waits for a communication result gives its slot back;
a collective completes when every member has arrived (a recv when its send has); free slots go to the
runnable rank with the smallest logical time (its own accumulated compute time), so ranks advance evenly.

When no rank runs or can run while some still wait, nothing can ever complete: `diagnose()` says which
ranks wait in which group, op, sequence number, shape and dtype, and what the missing members are doing.
A collective whose members disagree (op, dtype, or size where sizes must agree) never completes; it is
reported as soon as every member arrived (or, if some never do, as part of the hang).

Messages (tuples, rank -> coordinator):
    ("hello",)                                      a new rank, waiting for its first slot
    ("group", name, desc, members)                  a process group was created
    ("arrive", key, members, info)                  contributed to a collective / posted a send or recv
    ("wait", keys, logical_ns[, device_bytes])      blocks until every key completed and a slot is free
    ("done", keys)                                  finished reading the inputs of these keys
    ("exit", code)                                  the rank finished
Replies (coordinator -> rank): ("go", slot, immediate).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

from prism.runtime import ops
from prism.runtime.capture.device_state import SwapPolicy



class CaptureError(Exception):
    """The program cannot go on (a mismatch or a hang): the message explains it to the user."""


@dataclass
class Arrival:
    op: str
    dtype: str | None
    shape: str | None
    nbytes: int
    role: str = "member"  # member | send | recv


@dataclass
class KeyState:
    p2p: bool  # a message (key ("p", ...)) rather than a collective (key ("c", ...))
    members: tuple[int, ...]
    arrived: dict[int, Arrival] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    mismatch: str | None = None  # why the members disagree (such a collective never completes)

    matched: tuple | None = None  # an any-source recv ("a" key): the message ("p" key) it received
    local_members: int = 0  # a capture over hosts: the members on this host (0: all of them are)

    def complete(self) -> bool:
        if self.mismatch:
            return False
        if self.matched is not None:
            return True
        if self.p2p:  # sends are buffered: a message is there once it was sent
            return any(a.role == "send" for a in self.arrived.values())
        return len(self.arrived) == len(self.members)

    def readers(self) -> int:
        return 1 if self.p2p else (self.local_members or len(self.members))


@dataclass
class RankState:
    state: str = "new"  # new | runnable | running | blocked | exited
    slot: int = -1
    waiting: tuple = ()
    logical_ns: int = 0
    blocked_since: float = 0.0
    blocked_s: float = 0.0
    switches: int = 0
    exit_code: int | None = None
    ready_at_wait: bool = False
    waited: bool = False  # has sent a "wait" (its set-up, from its fork to its first block, is over)
    granted_at: float = 0.0  # when it got its slot


class Coordinator:
    def __init__(self, world: int, slots: int, policy: SwapPolicy | None = None, sticky: bool = False,
                 local: range | None = None) -> None:
        self.world = world
        # a capture over hosts (`host_bridge`): the ranks this coordinator runs; the others' arrivals come
        # through `arrive_remote`, and they count neither for a hang nor for the end
        self.local = local
        self.slots = slots
        self.policy = policy  # device-state decisions (None: host memory, nothing moves)
        self.sticky = sticky  # a rank always runs on slot rank % slots (CUDA: its context's GPU)
        self.device_actions: list[tuple[str, int]] = []  # ("suspend"|"resume", rank), done before "go"
        self.any_waiting: dict[tuple, list[tuple]] = {}  # (group, dst, tag) -> any-source recv keys
        self.unclaimed: dict[tuple, list[tuple]] = {}  # (group, dst, tag) -> sent message keys
        self.file_moves: list[tuple[tuple, tuple]] = []  # (message key, any-recv key): rename, before "go"
        self.footprint = [0] * world
        self.free_slots = list(range(slots))
        heapq.heapify(self.free_slots)
        self.ranks = [RankState() for _ in range(world)]
        self.counts = {"new": world, "runnable": 0, "running": 0, "blocked": 0, "exited": 0, "remote": 0}
        if local is not None:
            for r in range(world):
                if r not in local:
                    self.ranks[r].state = "remote"
            self.counts.update(new=len(local), remote=world - len(local))
        self.crashed = False  # a rank exited non-zero or vanished: the supervisor reports it
        self._current = -1  # the rank whose message is being handled
        self.keys: dict[tuple, KeyState] = {}
        self.groups: dict[str, tuple[str | None, tuple[int, ...]]] = {}
        self.runnable: list[tuple[int, int]] = []  # heap of (logical_ns, rank)
        self.context_switches = 0
        self.messages = 0
        self.completed_keys = 0
        self.finished_keys: list[tuple] = []  # keys whose files can be deleted (all members done)
        # where a capture's time goes (`phases`): when the last rank first blocked (every rank's set-up over:
        # init, group creation, the model, up to its first wait) and its CPU until then; the first and last exits
        self.marks: dict[str, float] = {}
        self.first_waits = 0
        self.slot_held_s = 0.0  # the slots' time held by a rank (against slots x wall: how busy they were)
        self.setup_cpu_ns = 0

    # -- message handling -------------------------------------------------------------------------------
    def handle(self, rank: int, msg: tuple) -> list[tuple[int, tuple]]:
        self.messages += 1
        self._current = rank
        kind = msg[0]
        rs = self.ranks[rank]
        if kind == "hello":
            self._set(rank, "runnable")
            heapq.heappush(self.runnable, (0, rank))
            if self.counts["new"] == 0:
                self.marks["all_hello"] = time.monotonic()
        elif kind == "group":
            _, name, desc, members = msg
            self.groups.setdefault(name, (desc, tuple(members)))
        elif kind == "arrive":
            _, key, members, info = msg
            self._arrive(rank, key, tuple(members), Arrival(*info))
        elif kind == "wait":
            _, keys, logical_ns, *mem = msg
            if not rs.waited:
                rs.waited = True
                self.first_waits += 1
                self.setup_cpu_ns += logical_ns
                if self.first_waits == self.world - self.counts["remote"]:
                    self.marks["all_waited"] = time.monotonic()
            if mem:
                self.footprint[rank] = mem[0]
                if self.policy is not None:
                    self.policy.update(rank, mem[0])
            self._release(rank)
            rs.logical_ns = logical_ns
            rs.waiting = tuple(keys)
            rs.blocked_since = time.monotonic()
            rs.ready_at_wait = self._ready(rs)
            if rs.ready_at_wait:
                self._set(rank, "runnable")
                heapq.heappush(self.runnable, (rs.logical_ns, rank))
            else:
                self._set(rank, "blocked")
        elif kind == "done":
            for key in msg[1]:
                st = self.keys.get(key)
                if st is None:
                    continue
                st.done.add(rank)
                if len(st.done) >= st.readers():
                    if key[0] == "p" and not any(a.role == "send" for a in st.arrived.values()):
                        continue  # read as soon as its file was there, before the send's arrival reached us:
                        # finished when it does (else that arrival would look like a message nobody claimed)
                    del self.keys[key]
                    self.finished_keys.append(key)
        elif kind == "exit":
            self.exited(rank, msg[1])
        else:
            raise ValueError(f"unknown message from rank {rank}: {msg!r}")
        return self.schedule()

    def exited(self, rank: int, code: int) -> None:
        rs = self.ranks[rank]
        if rs.state == "exited":
            return
        self._release(rank)
        self._set(rank, "exited")
        self.marks.setdefault("first_exit", time.monotonic())
        if self.all_exited():
            self.marks["last_exit"] = time.monotonic()
        if self.policy is not None:  # its device memory went with it
            self.policy.forget(rank)
        rs.exit_code = code
        if code != 0:
            self.crashed = True

    def _release(self, rank: int) -> None:
        rs = self.ranks[rank]
        if rs.slot >= 0:
            heapq.heappush(self.free_slots, rs.slot)
            rs.slot = -1
            self.slot_held_s += time.monotonic() - rs.granted_at

    def _arrive(self, rank: int, key: tuple, members: tuple[int, ...], info: Arrival) -> None:
        st = self.keys.get(key)
        if st is None:
            st = self.keys[key] = KeyState(key[0] in ("p", "a"), members)
            if self.local is not None and key[0] == "c":
                st.local_members = sum(1 for m in members if m in self.local)
        elif info.role == "member" and st.mismatch is None:
            first = next(iter(st.arrived.values()), None)
            if first is not None:
                st.mismatch = _disagreement(first, info)
        if rank in st.arrived and info.role == "member":
            raise CaptureError(f"rank {rank} arrived twice at {self.describe_key(key)}")
        st.arrived[rank] = info
        if key[0] == "a":
            self.any_waiting.setdefault((key[1], key[2], key[3]), []).append(key)
            self._match_any((key[1], key[2], key[3]))
        elif key[0] == "p" and info.role == "send":
            if len(st.done) >= st.readers():  # its specific recv already read it (see "done")
                del self.keys[key]
                self.finished_keys.append(key)
                self.completed_keys += 1
                return
            self.unclaimed.setdefault((key[1], key[3], key[4]), []).append(key)
            self._match_any((key[1], key[3], key[4]))
        if st.mismatch and len(st.arrived) == len(st.members):
            raise CaptureError("collective mismatch at " + self._explain(key, st))
        if st.complete():
            self.completed_keys += 1
            for peer in set(st.members) | set(st.arrived):
                prs = self.ranks[peer]
                if prs.state == "blocked" and key in prs.waiting and self._ready(prs):
                    self._set(peer, "runnable")
                    heapq.heappush(self.runnable, (prs.logical_ns, peer))

    def arrive_remote(self, rank: int, key: tuple, members: tuple, info: tuple) -> list[tuple[int, tuple]]:
        """A rank of another host arrived (its contribution already in this host's shared memory)."""
        self.messages += 1
        self._current = -1
        self._arrive(rank, key, tuple(members), Arrival(*info))
        return self.schedule()

    def _match_any(self, where: tuple) -> None:
        """Pair any-source recvs on (group, dst, tag) with sent messages no specific recv has claimed."""
        waiting, sent = self.any_waiting.get(where), self.unclaimed.get(where)
        while waiting and sent:
            p_key = sent.pop(0)
            pst = self.keys.get(p_key)
            if pst is None or any(a.role == "recv" for a in pst.arrived.values()):
                continue  # a specific recv takes it
            a_key = waiting.pop(0)
            ast = self.keys[a_key]
            ast.matched = p_key
            del self.keys[p_key]  # the message now belongs to the any-source recv
            self.file_moves.append((p_key, a_key))
            self.completed_keys += 1
            dst = a_key[2]
            prs = self.ranks[dst]
            if prs.state == "blocked" and a_key in prs.waiting and self._ready(prs):
                self._set(dst, "runnable")
                heapq.heappush(self.runnable, (prs.logical_ns, dst))

    def _ready(self, rs: RankState) -> bool:
        for key in rs.waiting:
            st = self.keys.get(key)
            if st is not None and not st.complete():
                return False
        return True

    # -- scheduling -----------------------------------------------------------------------------------
    def schedule(self) -> list[tuple[int, tuple]]:
        out = []
        deferred = []
        while self.free_slots and self.runnable:
            entry = heapq.heappop(self.runnable)
            rank = entry[1]
            rs = self.ranks[rank]
            if rs.state != "runnable":
                continue
            if self.sticky:
                home = rank % self.slots
                if home not in self.free_slots:
                    deferred.append(entry)
                    continue
                self.free_slots.remove(home)
                heapq.heapify(self.free_slots)
                slot = home
            else:
                slot = heapq.heappop(self.free_slots)
            if self.policy is not None:
                self.device_actions += self.policy.grant(slot, rank, self.footprint[rank])
            if rs.blocked_since:
                rs.blocked_s += time.monotonic() - rs.blocked_since
                rs.blocked_since = 0.0
                rs.switches += 1
                self.context_switches += 1
            self._set(rank, "running")
            # immediate: the rank's results were there when it waited and a slot was free at once, so its
            # round trip is the pure cost of a context switch
            immediate = rank == self._current and rs.ready_at_wait
            rs.slot, rs.waiting, rs.ready_at_wait = slot, (), False
            rs.granted_at = time.monotonic()
            out.append((rank, ("go", slot, immediate)))
        for entry in deferred:
            heapq.heappush(self.runnable, entry)
        return out

    def _set(self, rank: int, state: str) -> None:
        rs = self.ranks[rank]
        self.counts[rs.state] -= 1
        self.counts[state] += 1
        rs.state = state

    def stuck(self) -> bool:
        """No rank runs or can run, yet some have not finished (O(1): it is asked after every message)."""
        c = self.counts
        return c["running"] == 0 and c["runnable"] == 0 and c["new"] == 0 and c["blocked"] > 0

    def all_exited(self) -> bool:
        return self.counts["exited"] == self.world - self.counts["remote"]

    # -- diagnosis ------------------------------------------------------------------------------------
    def group_label(self, name: str) -> str:
        desc, members = self.groups.get(name, (None, ()))
        shown = ",".join(map(str, members)) if len(members) <= 16 else \
            f"{','.join(map(str, members[:8]))},...({len(members)} ranks)"
        label = desc if desc and desc != "undefined" else f"group {name}"
        return f"{label}[{shown}]"

    def describe_key(self, key: tuple, op: str | None = None) -> str:
        if key[0] == "c":
            _, group, seq = key
            return f"{op + ' ' if op else ''}#{seq} on {self.group_label(group)}"
        if key[0] == "a":
            _, group, dst, tag, k = key
            return f"receive #{k} from any rank by rank {dst} (tag {tag}) on {self.group_label(group)}"
        _, group, src, dst, tag, k = key
        return f"message #{k} from rank {src} to rank {dst} (tag {tag}) on {self.group_label(group)}"

    def doing(self, rank: int) -> str:
        rs = self.ranks[rank]
        if rs.state == "exited":
            return f"rank {rank} has exited (code {rs.exit_code})"
        if rs.state == "remote":
            return f"rank {rank} runs on another host"
        if rs.state in ("running", "runnable", "new"):
            return f"rank {rank} is running"
        parts = []
        for key in rs.waiting:
            st = self.keys.get(key)
            if st is None or st.complete():
                continue
            mine = st.arrived.get(rank)
            parts.append(f"{self.describe_key(key, mine.op if mine else None)}")
        return f"rank {rank} waits in " + "; ".join(parts) if parts else f"rank {rank} is blocked"

    def diagnose(self) -> str:
        lines = ["no rank can run and no communication can complete (the job would hang):"]
        seen = set()
        for rank, rs in enumerate(self.ranks):
            if rs.state != "blocked":
                continue
            for key in rs.waiting:
                st = self.keys.get(key)
                if key in seen or st is None or st.complete():
                    continue
                seen.add(key)
                lines.append("  " + self._explain(key, st))
        exited = [r for r, rs in enumerate(self.ranks) if rs.state == "exited"]
        if exited and len(exited) < self.world - self.counts["remote"]:
            lines.append(f"  finished ranks: {_ranges(exited)}")
        return "\n".join(lines)

    def _explain(self, key: tuple, st: KeyState) -> str:
        if key[0] == "a":
            return f"{self.describe_key(key)}: no rank sent it a message with that tag"
        if key[0] == "p":
            _, _, src, dst, tag, _ = key
            return f"{self.describe_key(key)}: rank {dst} waits to receive it; {self.doing(src)}"
        ops = [a.op for a in st.arrived.values()]
        op = max(set(ops), key=ops.count) if ops else "collective"
        show_op = len(set(ops)) > 1
        by_sig: dict[str, list[int]] = {}
        for r, a in sorted(st.arrived.items()):
            sig = f"{a.op + ' ' if show_op else ''}{a.dtype}[{a.shape}]"
            by_sig.setdefault(sig, []).append(r)
        arrived = "; ".join(f"{_who(rs)} arrived with {sig}" for sig, rs in by_sig.items())
        missing = [m for m in st.members if m not in st.arrived]
        parts = [arrived] + [self.doing(m) for m in missing[:8]]
        if len(missing) > 8:
            parts.append(f"... ({len(missing)} ranks missing)")
        why = f" ({st.mismatch})" if st.mismatch else ""
        return f"{op} {self.describe_key(key)}{why}: " + "; ".join(p for p in parts if p)

    def stats(self) -> dict:
        return {
            "context_switches": self.context_switches,
            "messages": self.messages,
            "completed_comms": self.completed_keys,
            "groups": len(self.groups),  # the groups ranks used (an unused group never reaches the coordinator)
            "blocked_s_total": sum(rs.blocked_s for rs in self.ranks),
            "setup_cpu_s": round(self.setup_cpu_ns / 1e9, 3),  # the ranks' CPU from their start to their first wait
            "slot_held_s": round(self.slot_held_s, 3),  # the slots' time held by a rank, all slots
        }

    def phases(self, began: float, now: float) -> dict:
        """Wall seconds of the capture's phases from `began` (the forks' end) to `now` (the coordinator's close):
        `hello` until every rank had asked for its first slot, `setup` until every rank had blocked once, `steps`
        from then until the last rank exited, `exits` from the first exit to the last (inside `steps`), `close`
        after the last exit. A phase that did not end: None."""
        m = self.marks

        def span(a, b):
            return None if a is None or b is None else round(b - a, 3)

        return {"hello": span(began, m.get("all_hello")), "setup": span(began, m.get("all_waited")),
                "steps": span(m.get("all_waited"), m.get("last_exit")),
                "exits": span(m.get("first_exit"), m.get("last_exit")), "close": span(m.get("last_exit"), now)}


def _disagreement(a: Arrival, b: Arrival) -> str | None:
    if a.op != b.op:
        return "ops differ: a rank skipped or reordered a collective on this group"
    if a.dtype != b.dtype:
        return "dtypes differ"
    # members contribute the same number of elements (as gloo and NCCL, which move counts: a member's shape may
    # differ, e.g. DeepSpeed's pipeline all-reduces a 0-d loss on one stage and a [1] on another)
    if a.op in ops.SAME_SHAPE and _count(a.shape) != _count(b.shape):
        return "sizes differ"
    return None


def _count(shape: str | None) -> int | None:
    """The element count of an arrival's shape ("4x8"; "" for a 0-d tensor)."""
    return None if shape is None else math.prod(int(d) for d in shape.split("x") if d)


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"


def _ranges(ranks) -> str:
    ranks = sorted(ranks)
    out, start, prev = [], None, None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out)
