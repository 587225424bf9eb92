"""Mode `emulate`: the virtual ranks' clock — one discrete-event loop over their calibrated program order.

Inputs (read with pyarrow; no analysis code): `graph/events.parquet` (every rank's events in program
order, `comm_id` linking the members of one communication, `op_event_id` linking a wait to its op) and
`calibrated/timeline.parquet` (each event's calibrated start/end on one clock from 0).

Each virtual rank has a cursor and a time `t` (ns since the common start t0). Its events, in order:
- compute / marker: lasts its calibrated duration (after the calibrated gap since the previous event);
- a communication issue: the rank *arrives* at `t` and goes on after the issue's calibrated duration;
- a wait: ends at max(t, the op's completion); if the completion is not known yet, the rank parks.
A communication among virtual ranks alone completes at its last member's arrival + its calibrated transfer
(calibrated completion - last calibrated arrival): computed, never executed. A communication with a sandbox
rank is real: the worker's thread for it calls `gate(comm)` (returns once every virtual member arrived,
sleeping until t0 + the last arrival on the wall clock) and `complete(comm)` once the real operation
completed; parked ranks then continue from that time. The loop itself never sleeps: virtual-only work is
computed as fast as Python goes; only real operations are held to the wall clock. So a sandbox rank slower
than recorded delays the virtual ranks that wait on it, and through them every rank that depends on those.

Everything the loop did is recorded (`events()`: RAW_EVENTS rows, times on the host monotonic clock).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prism import schemas

_COMM = set(schemas.COMM_KINDS)


def find_artifacts(capture: Path) -> tuple[Path, Path] | None:
    """graph/events.parquet and calibrated/timeline.parquet of the job holding `capture` (in it or its parent)."""
    for job in (capture, capture.parent):
        events, timeline = job / "graph" / "events.parquet", job / "calibrated" / "timeline.parquet"
        if events.is_file() and timeline.is_file():
            return events, timeline
    return None


class TimedReplay:
    def __init__(self, events_path: Path, timeline_path: Path, sandbox: set[int], steps_limit: int | None = None):
        ev = pq.read_table(events_path)
        tl = pq.read_table(timeline_path).select(["event_id", "start_ns", "end_ns"])
        times = dict(zip(tl["event_id"].to_pylist(), zip(tl["start_ns"].to_pylist(), tl["end_ns"].to_pylist())))
        self.sandbox = set(sandbox)
        rows = [r for r in ev.to_pylist() if r["rank"] not in self.sandbox]
        if steps_limit is not None:
            rows = [r for r in rows if r["iteration"] < steps_limit]
        rows.sort(key=lambda r: (r["rank"], r["seq"]))
        self.driven = {r["comm_id"] for r in rows if r["comm_id"] >= 0}  # comms the loop's ranks take part in
        all_members: dict[int, set[int]] = defaultdict(set)
        for r in ev.select(["rank", "comm_id"]).to_pylist():
            if r["comm_id"] >= 0:
                all_members[r["comm_id"]].add(r["rank"])
        self.real = {c for c, ms in all_members.items() if ms & self.sandbox}
        self.virtual_members = {c: ms - self.sandbox for c, ms in all_members.items()}
        # calibrated transfer of each virtual-only communication: completion - last arrival
        arrive: dict[int, int] = defaultdict(int)
        done: dict[int, int] = {}
        by_id = {r["event_id"]: r for r in ev.select(["event_id", "comm_id"]).to_pylist()}
        for r in ev.select(["event_id", "kind", "comm_id", "op_event_id"]).to_pylist():
            if r["kind"] in _COMM and r["comm_id"] >= 0 and r["event_id"] in times:
                arrive[r["comm_id"]] = max(arrive[r["comm_id"]], times[r["event_id"]][0])
            elif r["kind"] == schemas.KIND_WAIT and r["op_event_id"] >= 0 and r["event_id"] in times:
                c = by_id.get(r["op_event_id"], {}).get("comm_id", -1)
                if c >= 0:  # the earliest wait end of a member bounds the completion
                    done[c] = min(done.get(c, times[r["event_id"]][1]), times[r["event_id"]][1])
        self.transfer = {c: max(0, done[c] - arrive[c]) for c in done if c in arrive}
        self.ranks: dict[int, list[dict]] = defaultdict(list)
        prev_end: dict[int, int] = {}
        for r in rows:
            start, end = times.get(r["event_id"], (0, 0))
            r["_gap"] = max(0, start - prev_end.get(r["rank"], start))
            r["_dur"] = max(0, end - start)
            prev_end[r["rank"]] = end
            self.ranks[r["rank"]].append(r)
        self.collective_comm: dict[tuple[str, int], int] = {}
        self.p2p_comms: dict[tuple, list[int]] = defaultdict(list)  # (group, src, dst, tag) -> comms in order
        for r in ev.select(["rank", "seq", "kind", "group", "group_seq", "peer", "tag", "comm_id"]).to_pylist():
            if r["kind"] == schemas.KIND_COLLECTIVE:
                self.collective_comm[(r["group"], r["group_seq"])] = r["comm_id"]
        for r in sorted(rows, key=lambda r: r["seq"]):
            if r["kind"] == schemas.KIND_SEND:
                self.p2p_comms[(r["group"], r["rank"], r["peer"], r["tag"])].append(r["comm_id"])
            elif r["kind"] == schemas.KIND_RECV:
                self.p2p_comms[(r["group"], r["peer"], r["rank"], r["tag"])].append(r["comm_id"])
        self.op_comm = {r["event_id"]: r["comm_id"] for rs in self.ranks.values() for r in rs if r["comm_id"] >= 0}
        self.arrivals: dict[int, dict[int, int]] = defaultdict(dict)
        self.completion: dict[int, int] = {}
        self.parked: dict[int, list[int]] = defaultdict(list)  # comm -> ranks waiting on it
        self.heap: list[tuple[int, int]] = []
        self.cursor = {v: 0 for v in self.ranks}
        self.clock = {v: 0 for v in self.ranks}
        self.out: list[dict] = []
        self.out_comm: list[int] = []  # the comm of each recorded op (-1: none)
        self.cv = threading.Condition()
        self.t0_ns = 0
        self.stopped = False
        self.error: str | None = None

    def message_comm(self, group: str, src: int, dst: int, tag: int, k: int) -> int:
        """The comm of the k-th message of a channel with a virtual end (-1: not driven by the loop)."""
        comms = self.p2p_comms.get((group, src, dst, tag), [])
        return comms[k] if k < len(comms) else -1

    # -- the worker's threads ----------------------------------------------------------------------------
    def gate(self, comm: int) -> None:
        """Block until every virtual member of real communication `comm` arrived and the wall clock reached
        the last arrival (a comm the loop does not drive, e.g. beyond --steps-limit, passes at once)."""
        if comm < 0 or comm not in self.driven:
            return
        want = self.virtual_members.get(comm, set()) & set(self.ranks)
        with self.cv:
            while not self.stopped and not want <= set(self.arrivals[comm]):
                self.cv.wait(0.5)
            last = max((self.arrivals[comm][v] for v in want), default=0)
        delay = (self.t0_ns + last - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)

    def complete(self, comm: int) -> None:
        """The real communication `comm` completed now."""
        if comm < 0:
            return
        with self.cv:
            self.completion[comm] = time.monotonic_ns() - self.t0_ns
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        heap = self.heap = [(0, v) for v in self.ranks]
        heapq.heapify(heap)
        waiting_real: dict[int, list[int]] = defaultdict(list)
        while not self.stopped:
            if not heap:
                with self.cv:
                    ready = [c for c in waiting_real if c in self.completion]
                    if not ready:
                        if not waiting_real:
                            return
                        self.cv.wait(0.5)
                        continue
                for c in ready:
                    for v in waiting_real.pop(c):
                        heapq.heappush(heap, (max(self.clock[v], self.completion[c]), v))
                continue
            _, v = heapq.heappop(heap)
            blocked = self._advance(v)
            if blocked is None:
                continue
            kind, comm = blocked
            if kind == "real":
                waiting_real[comm].append(v)
            else:
                self.parked[comm].append(v)

    def _advance(self, v: int):
        """Run rank v's events until it blocks (returns ("real"|"virtual", comm)) or ends (None)."""
        events, i, t = self.ranks[v], self.cursor[v], self.clock[v]
        while i < len(events):
            e = events[i]
            kind = e["kind"]
            if kind == schemas.KIND_WAIT:
                comm = self.op_comm.get(e["op_event_id"], -1)
                if comm >= 0 and comm not in self.completion:
                    self.cursor[v], self.clock[v] = i, t
                    return ("real" if comm in self.real else "virtual", comm)
                start = t + e["_gap"]
                end = max(start, self.completion.get(comm, start))
            else:
                start = t + e["_gap"]
                end = start + e["_dur"]
                if kind in _COMM and e["comm_id"] >= 0:
                    self._arrive(e["comm_id"], v, start)
            self._record(e, start, end)
            t = end
            i += 1
        self.cursor[v], self.clock[v] = i, t
        return None

    def _arrive(self, comm: int, v: int, t: int) -> None:
        with self.cv:
            self.arrivals[comm][v] = t
            if comm in self.real:
                self.cv.notify_all()
                return
        members = self.virtual_members[comm] & set(self.ranks)
        if members <= set(self.arrivals[comm]):
            done = max(self.arrivals[comm].values()) + self.transfer.get(comm, 0)
            self.completion[comm] = done
            for u in self.parked.pop(comm, []):
                self._resume(u, done)

    def _resume(self, u: int, done: int) -> None:
        """u's wait (at its clock) can end at `done`: back on the heap (the wait is recorded on resuming)."""
        heapq.heappush(self.heap, (max(self.clock[u], done), u))

    def _record(self, e: dict, start: int, end: int) -> None:
        row = {f.name: e.get(f.name) for f in schemas.RAW_EVENTS}
        for name in ("mem_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
            if row[name] is None:  # a graph from before the field existed: not measured
                row[name] = -1
        row["t_start_ns"], row["t_end_ns"] = self.t0_ns + start, self.t0_ns + end
        row["cpu_ns"] = row["device_ns"] = end - start
        self.out.append(row)
        self.out_comm.append(e["comm_id"] if e["kind"] in _COMM else -1)

    def table(self) -> pa.Table:
        """The replayed events; an op's `t_complete_ns` is its completion (known by now, or -1)."""
        for row, comm in zip(self.out, self.out_comm):
            row["t_complete_ns"] = self.t0_ns + self.completion[comm] if comm in self.completion else -1
        return pa.Table.from_pylist(self.out, schema=schemas.RAW_EVENTS)
