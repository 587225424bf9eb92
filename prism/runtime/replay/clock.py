"""Mode `emulate`: the virtual ranks' clock, driven live only inside the sandbox's dependency cone.

Inputs (read with pyarrow; no analysis code): `graph/events.parquet` and `calibrated/timeline.parquet`,
turned into arrays and cut to the cone by `prism.runtime.replay.cone`: only the virtual events *between* two real
communications (those with a sandbox rank) run live; the others keep their calibrated times (before any
real comm can move them) or are computed afterwards by the emulate stage's sweep (after the last real comm
that could see them).

The live events follow the clock rule the calibrate sweep follows, from the one module both import
(`prism.clock_rule`): each rank's events run back to back from the calibrated start of its first live event;
a compute event or an issue lasts its calibrated duration, the issue being the rank's arrival at its comm; a
virtual-only comm completes at its last arrival + its calibrated transfer (p2p: max(recv arrival, send
arrival + transfer)); a wait on a collective or a recv ends its own time after max(its start, the
completion), a wait on a send after its own time.
A comm with a sandbox rank is real: the worker's thread for it calls `gate(comm)` (returns once every
virtual member's arrival is known, sleeping until t0 + the last one on the wall clock) and `complete(comm)`
once the real operation completed; the ranks parked on it then go on from that time.

The transfer hold (emulation, not slice runs): a real comm completes no earlier than the calibrated model
says for the live arrivals, last arrival + the comm's calibrated transfer -- the real operation runs among
the pruned participants only, and on a gloo host it is much shorter than the whole group's (in the W=8
fidelity runs the emulated sandbox's iteration was up to 24 % shorter than the prediction for its rank
without it). A collective's data moves as soon as its participants arrive; its *completion* is held: the
worker exchanges at t0 + the virtual members' last arrival (`gate(comm)`), sends the sandbox members the
comm's virtual floor, t0 + that arrival + the transfer (what `gate` returns; `emulation.FLOOR_TAG`), and
completes the comm for the virtual ranks no earlier (`complete(comm, floor)`); a sandbox member's
collective ends no earlier than that floor nor than the last sandbox member's arrival + the transfer (the
sandbox participants exchange their arrivals; before session 17 only its own counted, and a member that
arrived first completed a transfer early: dp8's DP all-reduces 50 ms an iteration) (`collective_transfers`,
published to the sandbox ranks before the common start), held off the thread that exchanges
(`emulated_works`). A native op of a group of sandbox ranks only (`native_group`) is not held: it is the
job's own gloo op among the job's own ranks. So the op completes about at the model's completion whoever arrives last, and a burst
of collectives whose completions bunch (async all-reduces waited at the end of the backward pass) completes
together, not one exchange apart after the floor (device-10, `docs/fidelity.md`). A p2p message from a
virtual rank has no floor message: the worker still releases it at t0 + the send's arrival + the transfer
(`gate(comm, hold=True)`) less the real exchange that follows (the shortest of the channel's last 8).

The loop is a numba kernel (`_advance`) over arrays; it never sleeps: it runs until every live rank waits
on a real comm not yet complete, then waits for the next completion. `gate` measures how late the virtual
clock was: the wall time at which a real comm's virtual arrivals became known, past both t0 + the last
arrival and the time the worker's thread reached the gate. That is the time the simulator, not the modelled
job, held the op (`stats()["gate_late_max_ms"]`); a sandbox slower than calibrated, or a worker thread
behind, is not counted. `complete` records when each real exchange completed and the last virtual arrival at
it then: `exchange_delays` (meta.json's ``exchange_late_by_op``) and `exchanges_table` (the worker's
``raw/replay/exchanges.arrow``, from which the emulate stage builds ``emulation/delays.parquet``).

The clock's zero t0 is the common start of the sandbox ranks and the worker (`prism.runtime.emulate.common_start`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numba import njit

from prism import job_paths, schemas
from prism.clock_rule import collective_done, ends, p2p_done, wait_ends
from prism.runtime.replay import cone as cones
from prism.runtime.replay.cone import ARRIVE_RECV, ARRIVE_SEND, NEG, PLAIN, WAIT

def find_artifacts(capture: Path) -> tuple[Path, Path] | None:
    """graph/events.parquet and calibrated/timeline.parquet of the job holding `capture` (in it or its parent)."""
    for job in (capture, capture.parent):
        events, timeline = job_paths.graph_file(job), job_paths.calibrated(job)
        if events.is_file() and timeline.is_file():
            return events, timeline
    return None


@njit(cache=True)
def _advance(code, dur, comm, hi, cursor, clock, start, end, pending, acc, acc_send, acc_recv, xfer, p2p, real,
             completion, park_head, park_next, stack, n_stack):
    """Run the ranks on `stack[:n_stack]` until each is parked on an incomplete comm or done; returns the
    number of events run. Arrays are the live events in rank order (`cursor`/`hi` per live rank) and the
    comms (`pending`: live arrivals still to come)."""
    ran = 0
    while n_stack > 0:
        n_stack -= 1
        r = stack[n_stack]
        i = cursor[r]
        t = clock[r]
        while i < hi[r]:
            k = code[i]
            c = comm[i]
            if k == WAIT:
                done = completion[c]
                if done == NEG:
                    park_next[r] = park_head[c]
                    park_head[c] = r
                    break
                s = t
                e = wait_ends(t, dur[i], done)
            else:
                s = t
                e = ends(t, dur[i])
                if k != PLAIN and k < WAIT and c >= 0:  # an issue: the rank arrives at comm c
                    acc[c] = max(acc[c], s)
                    if k == ARRIVE_SEND:
                        acc_send[c] = max(acc_send[c], s)
                    elif k == ARRIVE_RECV:
                        acc_recv[c] = max(acc_recv[c], s)
                    pending[c] -= 1
                    if pending[c] == 0 and not real[c]:
                        if p2p[c]:
                            completion[c] = p2p_done(acc_recv[c], acc_send[c], xfer[c])
                        else:
                            completion[c] = collective_done(acc[c], xfer[c])
                        u = park_head[c]
                        while u >= 0:
                            nxt = park_next[u]
                            stack[n_stack] = u
                            n_stack += 1
                            u = nxt
                        park_head[c] = -1
            start[i] = s
            end[i] = e
            t = e
            i += 1
            ran += 1
        cursor[r] = i
        clock[r] = t
    return ran


def _take_rows(path: Path, columns: list[str], rows: np.ndarray) -> pa.Table:
    """Rows `rows` of a Parquet file's `columns`, read a column at a time (a W=1024 graph has 2M rows)."""
    index = pa.array(rows, pa.int64())
    return pa.table({name: pq.read_table(path, columns=[name])[name].take(index) for name in columns})


class TimedReplay:
    def __init__(self, events_path: Path, timeline_path: Path, sandbox: set[int], steps_limit: int | None = None,
                 progress: Callable[[int, int, int, float], None] | None = None):
        started, cpu = time.monotonic(), time.thread_time()
        self.events_path = Path(events_path)
        self.sandbox = set(sandbox)
        job = self.job = cones.load(events_path, timeline_path, self.sandbox, steps_limit)
        m = len(job.comm_ids)
        live = np.flatnonzero(job.live)
        self.live_pos = live
        # the live events, rank by rank (each rank's live events are contiguous)
        self.code, self.dur, self.comm = job.code[live], job.dur[live], job.comm[live]
        ranks, first, counts = np.unique(job.rank[live], return_index=True, return_counts=True)
        self.live_ranks = ranks
        self.lo = first.astype(np.int64)
        self.hi = (first + counts).astype(np.int64)
        self.cursor = self.lo.copy()
        self.clock = job.start[live][first].astype(np.int64) if len(live) else np.empty(0, np.int64)
        self.start = np.full(len(live), NEG, dtype=np.int64)
        self.end = np.full(len(live), NEG, dtype=np.int64)
        # comms: static arrivals (kept virtual members not live, at their calibrated start) and live ones to come
        issue = (job.code >= cones.ARRIVE) & (job.code <= ARRIVE_RECV) & job.virtual
        static = issue & ~job.live
        c_static = job.comm[static]
        self.acc = np.full(m, NEG, dtype=np.int64)
        self.acc_send = np.full(m, NEG, dtype=np.int64)
        self.acc_recv = np.full(m, NEG, dtype=np.int64)
        np.maximum.at(self.acc, c_static, job.start[static])
        for code, acc in ((ARRIVE_SEND, self.acc_send), (ARRIVE_RECV, self.acc_recv)):
            sel = static & (job.code == code)
            np.maximum.at(acc, job.comm[sel], job.start[sel])
        self.pending = np.bincount(job.comm[issue & job.live], minlength=m).astype(np.int64)
        self.xfer, self.p2p, self.real = job.xfer, job.p2p, job.real
        self.completion = np.full(m, NEG, dtype=np.int64)
        ready = (self.pending == 0) & ~job.real
        self.completion[ready] = np.where(job.p2p[ready],
                                          p2p_done(self.acc_recv[ready], self.acc_send[ready], job.xfer[ready]),
                                          collective_done(self.acc[ready], job.xfer[ready]))
        self.park_head = np.full(m, -1, dtype=np.int64)
        self.park_next = np.full(len(ranks), -1, dtype=np.int64)
        self.stack = np.empty(len(ranks), dtype=np.int64)
        # real comms the loop drives: every virtual member kept (later ones, beyond --steps-limit, pass at once)
        virtual_rank = ~np.isin(job.rank, np.asarray(sorted(self.sandbox), dtype=np.int32))
        all_issue = (job.code >= cones.ARRIVE) & (job.code <= ARRIVE_RECV)
        dropped = np.zeros(m, dtype=bool)
        dropped[job.comm[all_issue & virtual_rank & ~job.virtual]] = True
        has_virtual = np.zeros(m, dtype=bool)
        has_virtual[job.comm[issue]] = True
        self.driven_mask = job.real & has_virtual & ~dropped
        # the worker's names of real comms, from the sandbox ranks' own events (small)
        self.index = {int(c): i for i, c in enumerate(job.comm_ids) if job.real[i]}
        sb = ~virtual_rank & all_issue
        self._names(sb)
        self.iteration_of = np.full(m, -1, dtype=np.int64)
        self.iteration_of[job.comm[sb]] = job.iteration[sb]
        todo = self.iteration_of[self.driven_mask]
        self.iterations = sorted(set(todo.tolist()))
        counts = zip(*np.unique(todo, return_counts=True))
        self.left_in_iteration = defaultdict(int, {int(k): int(v) for k, v in counts})
        self.progress = progress  # (iteration, iterations done, of, seconds since t0), once per iteration
        self.iterations_done = 0
        self.completed = np.zeros(m, dtype=bool)
        self.cv = threading.Condition()
        self.t0_ns = 0
        self.running = threading.Event()  # set by `run` once t0 is known
        self.stopped = False
        self.error: str | None = None
        self._inbox: list[tuple[int, int]] = []
        self.late_ns: list[int] = []  # per gated comm: how long the virtual clock made it wait past its time
        # per real exchange completed: (comm index, its completion, ns from t0; the last virtual arrival then)
        self.exchanges: list[tuple[int, int, int]] = []
        self.kernel_s = 0.0  # wall time in the kernel
        self.kernel_cpu_s = 0.0  # its thread's CPU time (what a loaded machine does not inflate)
        self.events_run = 0
        self._step(0)  # compiles (or loads from numba's cache) the kernel now, before the common start
        self.kernel_s = self.kernel_cpu_s = 0.0
        self.setup_s = time.monotonic() - started
        self.setup_cpu_s = time.thread_time() - cpu

    def _names(self, sb: np.ndarray) -> None:
        """collective (group, group_seq) -> comm_id, and the comm_ids of each p2p channel's messages."""
        cols = ["kind", "group_name", "group_seq", "peer", "tag", "comm_id", "rank", "seq"]
        if "op" in pq.read_schema(self.events_path).names:  # (a hand-made graph may lack it)
            cols.append("op")
        rows = np.sort(self.job.pos[sb])
        table = _take_rows(self.events_path, cols, rows) if len(rows) else None
        self.collective_comm: dict[tuple[str, int], int] = {}
        self.p2p_comms: dict[tuple, list[int]] = defaultdict(list)  # (group, src, dst, tag) -> comms in order
        self.op_of: dict[int, str] = {}  # comm index -> its op (all_reduce, all_to_all, send, ...)
        if table is None:
            return
        table = table.sort_by([("rank", "ascending"), ("seq", "ascending")])
        for r in table.to_pylist():
            i = self.index.get(r["comm_id"])
            if i is not None and (i not in self.op_of or r["kind"] == schemas.KIND_SEND):
                p2p = r["kind"] in (schemas.KIND_SEND, schemas.KIND_RECV)
                self.op_of[i] = "send/recv" if p2p else str(r.get("op") or r["kind"])
            if r["kind"] == schemas.KIND_COLLECTIVE:
                self.collective_comm[(r["group_name"], r["group_seq"])] = r["comm_id"]
            elif r["kind"] == schemas.KIND_SEND and r["peer"] not in self.sandbox:
                self.p2p_comms[(r["group_name"], r["rank"], r["peer"], r["tag"])].append(r["comm_id"])
            elif r["kind"] == schemas.KIND_RECV and r["peer"] not in self.sandbox:
                self.p2p_comms[(r["group_name"], r["peer"], r["rank"], r["tag"])].append(r["comm_id"])

    @property
    def driven(self) -> set[int]:
        return {int(c) for c in self.job.comm_ids[self.driven_mask]}

    def message_comm(self, group: str, src: int, dst: int, tag: int, k: int) -> int:
        """The comm of the k-th message of a channel with a virtual end (-1: not driven by the loop)."""
        comms = self.p2p_comms.get((group, src, dst, tag), [])
        return comms[k] if k < len(comms) else -1

    # -- the worker's threads ----------------------------------------------------------------------------
    def arrival(self, comm: int) -> int | None:
        """The last virtual member's arrival at real comm `comm` (ns from t0), None while not known."""
        i = self.index[comm]
        return int(self.acc[i]) if self.pending[i] == 0 else None

    def collective_transfers(self) -> dict[str, int]:
        """The calibrated transfer (ns, >= 0) of every real collective, by "<group>/<group_seq>": what a
        sandbox member's op lasts at least from its own arrival (the transfer hold, module doc)."""
        return {f"{g}/{k}": max(0, int(self.xfer[self.index[c]])) for (g, k), c in self.collective_comm.items()
                if c in self.index}

    def wait_owns(self) -> dict[str, dict[str, int]]:
        """Per sandbox rank ("<rank>"), the calibrated own time (ns, > 0) of its first blocking wait on each real
        collective, by "<group>/<group_seq>": the model ends that wait its own time after max(its start, the
        completion) (`clock_rule.wait_ends`; a member's lag behind the first member to see the completion), so
        the sandbox's work holds that long past its floor (`emulate.works.EmuWork`)."""
        name = {self.index[c]: f"{g}/{k}" for (g, k), c in self.collective_comm.items() if c in self.index}
        job = self.job
        sel = np.flatnonzero((job.code == WAIT) & ~job.virtual & (job.comm >= 0))
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for i in sel:  # (rank, seq) order: a rank's first wait on a comm comes first
            key = name.get(int(job.comm[i]))
            mine = out[str(int(job.rank[i]))]
            if key is not None and key not in mine and int(job.dur[i]) > 0 and not job.p2p[job.comm[i]]:
                mine[key] = int(job.dur[i])
        return dict(out)

    def gate(self, comm: int, hold: bool = False, lead_ns: int = 0) -> int:
        """Block until every virtual member of real communication `comm` arrived and the wall clock reached
        the last arrival (with `hold`: the last arrival + the comm's calibrated transfer less `lead_ns`, the
        real exchange that follows, but not before the last arrival); a comm the loop does not drive, e.g.
        beyond --steps-limit, passes at once. Returns the comm's virtual floor: t0 + the last virtual
        arrival + the calibrated transfer (host monotonic ns; 0 for a comm not driven)."""
        i = self.index.get(comm, -1) if comm >= 0 else -1
        if i < 0 or not self.driven_mask[i]:
            return 0
        while not self.stopped and not self.running.wait(0.5):
            pass
        reached = time.monotonic_ns()
        with self.cv:
            while not self.stopped and self.pending[i] > 0:
                self.cv.wait(0.5)
            last = int(self.acc[i])
        now = time.monotonic_ns()
        target = self.t0_ns + last
        # the clock's own delay: the op could go at max(target, reached) but its arrival was known only now
        self.late_ns.append(max(0, now - max(target, reached)))
        floor = target + max(0, int(self.xfer[i]))
        if hold:
            target += max(0, int(self.xfer[i]) - lead_ns)
        if target > now:
            time.sleep((target - now) / 1e9)
        return floor

    def complete(self, comm: int, not_before: int = 0) -> None:
        """The real communication `comm` completed now; for the virtual ranks, no earlier than `not_before`
        (host monotonic ns: its virtual floor, `gate`)."""
        i = self.index.get(comm, -1) if comm >= 0 else -1
        if i < 0:
            return
        now = time.monotonic_ns() - self.t0_ns
        if self.driven_mask[i] and self.pending[i] == 0:  # how late it completed: `exchange_delays`, `exchanges_table`
            self.exchanges.append((i, now, int(self.acc[i])))
        self.feed(comm, max(now + self.t0_ns, not_before) - self.t0_ns)

    def feed(self, comm: int, t_ns: int) -> None:
        """Real comm `comm` completed at `t_ns` (ns from t0): the loop goes on from there."""
        i = self.index[comm]
        finished = None
        with self.cv:
            self._inbox.append((i, t_ns))
            self.cv.notify_all()
            if self.driven_mask[i] and not self.completed[i]:
                self.completed[i] = True
                k = int(self.iteration_of[i])
                self.left_in_iteration[k] -= 1
                if self.left_in_iteration[k] == 0:
                    self.iterations_done += 1
                    finished = (k, self.iterations_done)
        if finished is not None and self.progress is not None:
            self.progress(*finished, len(self.iterations), t_ns / 1e9)

    def stop(self) -> None:
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        self.running.set()

    # -- the loop ----------------------------------------------------------------------------------------
    def _step(self, n_stack: int) -> None:
        began, cpu = time.perf_counter(), time.thread_time()
        self.events_run += _advance(self.code, self.dur, self.comm, self.hi, self.cursor, self.clock, self.start,
                                    self.end, self.pending, self.acc, self.acc_send, self.acc_recv, self.xfer,
                                    self.p2p, self.real, self.completion, self.park_head, self.park_next,
                                    self.stack, n_stack)
        self.kernel_s += time.perf_counter() - began
        self.kernel_cpu_s += time.thread_time() - cpu

    def run(self, t0_ns: int) -> None:
        """Drive the live events from t0 until every live rank finished (or `stop`)."""
        self.t0_ns = t0_ns
        self.running.set()
        with self.cv:
            self.stack[:] = np.arange(len(self.live_ranks))
            self._step(len(self.live_ranks))
            self.cv.notify_all()
            while not self.stopped and bool((self.cursor < self.hi).any()):
                if not self._inbox:
                    self.cv.wait(0.5)
                    continue
                n = 0
                for i, t in self._inbox:  # (each parked rank is on one comm: the stack holds them all)
                    n = self._release(i, t, n)
                self._inbox.clear()
                self._step(n)
                self.cv.notify_all()

    def _release(self, i: int, t_ns: int, n: int = 0) -> int:
        """Comm index i completed at t_ns: its parked ranks onto the stack from `n`; returns the new size."""
        if self.completion[i] != NEG:
            return n
        self.completion[i] = t_ns
        u = self.park_head[i]
        while u >= 0:
            self.stack[n] = u
            n += 1
            u = self.park_next[u]
        self.park_head[i] = -1
        return n

    def simulate(self, completions: dict[int, int]) -> None:
        """Without a wall clock (tests): real comm `c` completes at `completions[c]` ns (from t0), fed as
        soon as every virtual arrival at it is known (the real op cannot complete before its gate)."""
        left = dict(completions)
        self.stack[:] = np.arange(len(self.live_ranks))
        self._step(len(self.live_ranks))
        while left:
            c = next((c for c in left if self.arrival(c) is not None), None)
            if c is None:
                raise RuntimeError(f"no real comm of {sorted(left)} has every virtual arrival")
            self._step(self._release(self.index[c], left.pop(c)))

    def exchange_delays(self) -> dict[str, dict]:
        """Per op kind of the real exchanges: how late each completed against the model (ms; median, p95,
        max, mean over n). ``vs_model``: against the model's completion for the arrivals as they happened (the
        last live virtual arrival + the calibrated transfer): the emulation's own delay, and a sandbox member
        arriving later than its virtual peers (the emulate stage's ``emulation/delays.parquet`` counts the
        sandbox's arrivals too, from `exchanges_table`); ``vs_calibrated``: against the calibrated timeline's
        completion, which the sandbox's own speed moves too (the program's behaviour)."""
        late: dict[str, list[tuple[int, int]]] = defaultdict(list)  # op -> (vs model, vs calibrated)
        for i, now, arrival in list(self.exchanges):
            calibrated = int(self.job.completion[i])
            late[self.op_of.get(i, "?")].append((now - (arrival + max(0, int(self.xfer[i]))),
                                                 now - calibrated if calibrated != NEG else 0))
        out = {}
        for op, pairs in sorted(late.items()):
            a = np.asarray(pairs, dtype=np.float64) / 1e6
            out[op] = {"n": len(pairs), **{f"{name}_{stat}_ms": float(f(a[:, j])) for j, name in
                                           enumerate(("vs_model", "vs_calibrated")) for stat, f in
                                           (("median", np.median), ("p95", lambda x: np.percentile(x, 95)),
                                            ("max", np.max), ("mean", np.mean))}}
        return out

    def exchanges_table(self) -> pa.Table:
        """The real exchanges completed, one row each in comm order (`schemas.RAW_EXCHANGES`: what the emulate
        stage's ``emulation/delays.parquet`` is built from)."""
        rows = sorted(self.exchanges)
        i = np.asarray([r[0] for r in rows], dtype=np.int64)
        calibrated = self.job.completion[i]
        return pa.table({
            "comm_id": pa.array(self.job.comm_ids[i], pa.int64()),
            "op": pa.array([self.op_of.get(int(k), "?") for k in i], pa.string()).dictionary_encode(),
            "iteration": pa.array(self.iteration_of[i], pa.int32()),
            "completed_ns": pa.array([r[1] for r in rows], pa.int64()),
            "virtual_arrival_ns": pa.array([r[2] for r in rows], pa.int64()),
            "transfer_ns": pa.array(np.maximum(self.xfer[i], 0), pa.int64()),
            "calibrated_completion_ns": pa.array(calibrated, pa.int64(), mask=calibrated == NEG),
        }).cast(schemas.RAW_EXCHANGES)

    def stats(self) -> dict:
        live, virtual = self.job.cone_size
        late = np.asarray(self.late_ns or [0], dtype=np.int64)
        return {"cone_live_events": live, "virtual_events": virtual, "replayed_events": int(self.events_run),
                "exchange_late_by_op": self.exchange_delays(),
                "real_comms_gated": len(self.late_ns), "gate_late_max_ms": float(late.max()) / 1e6,
                "gate_late_total_ms": float(late.sum()) / 1e6, "replay_setup_s": self.setup_s,
                "replay_setup_cpu_s": self.setup_cpu_s, "replay_kernel_s": self.kernel_s,
                "replay_kernel_cpu_s": self.kernel_cpu_s}

    def table(self) -> pa.Table:
        """The replayed (live) events, times on the host monotonic clock; an op's `t_complete_ns` is its
        comm's completion (known by now, or -1)."""
        with self.cv:  # real completions the loop did not need (its ranks had finished)
            for i, t in self._inbox:
                if self.completion[i] == NEG:
                    self.completion[i] = t
            self._inbox.clear()
        done = self.end != NEG
        rows = self.job.pos[self.live_pos[done]]
        order = np.argsort(rows, kind="stable")
        graph = _take_rows(self.events_path, schemas.RAW_EVENTS.names, rows[order])
        start = self.start[done][order] + self.t0_ns
        end = self.end[done][order] + self.t0_ns
        comm = self.comm[done][order]
        code = self.code[done][order]
        is_op = (code != PLAIN) & (code < WAIT) & (comm >= 0)
        comp = np.where(is_op, self.completion[np.maximum(comm, 0)], NEG)
        cols = {name: graph[name] for name in schemas.RAW_EVENTS.names}
        cols["t_start_ns"], cols["t_end_ns"] = pa.array(start, pa.int64()), pa.array(end, pa.int64())
        cols["cpu_ns"] = cols["device_ns"] = pa.array(end - start, pa.int64())
        cols["t_complete_ns"] = pa.array(np.where(comp != NEG, comp + self.t0_ns, -1), pa.int64())
        for name in ("mem_bytes", "mem_peak_bytes", "mem_reserved_bytes"):
            cols[name] = pc.fill_null(cols[name], -1)  # a graph from before the field existed: not measured
        return pa.table(cols).cast(schemas.RAW_EVENTS)
