"""Mode `emulate`, the replay worker: one process that stands in for every virtual rank (see
`prism.runtime.emulate.transport`).

It reads the capture's plan (`prism.runtime.replay.plan.load_plan`), creates the compensators of each group that holds a
sandbox rank and a virtual one (pruned: one per run of consecutive virtual members; `--no-pruning`: one
per virtual member), and replays: per group one thread takes the group's collectives in `group_seq` order
and runs, for each compensator in group order, its part of the pruned protocol (`pruned.run` over its
run's recorded contributions); per message channel between a sandbox rank and a virtual one, one thread
sends the recorded payloads or receives the sandbox's messages. Payloads are read a few ahead of use.

When everything is replayed it writes `status_dir/replay.done` (its numbers for meta.json) and waits to be
stopped (SIGTERM); stopped earlier, it says what it still waited for.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc  # noqa: F401  (pa.ipc)
import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from prism import job_paths
from prism.runtime import shm, watchdog
from prism.runtime.emulate import compensation as comp
from prism.runtime.emulate import pruned
from prism.runtime.emulate import transport
from prism.runtime.emulate.common_start import common_start
from prism.runtime.emulate.works import STATS, STATS_LOCK
from prism.runtime.launch.zygote_spec import ZygoteSpec
from prism.runtime.replay import clock
from prism.runtime.replay.cone import ConeError
from prism.runtime.replay.host import VirtualRanks, keep_until_exit
from prism.runtime.replay.plan import Channel, Collective, ReplayError, load_plan
from prism.runtime.replay.prefetch import PayloadPool
from prism.runtime.semantics import RedOp


EXCHANGES = 8  # a p2p transfer hold's lead: the shortest of a channel's last 8 real exchanges


class EmulationWorker(VirtualRanks):
    def __init__(self, plan, capture: Path, timeout: timedelta, pruned: bool, prefetch_bytes: int = 0) -> None:
        super().__init__(plan, capture, timeout)
        self.pool = PayloadPool(prefetch_bytes, self._read_file)
        # every group's compensators are built (every participant takes part in its collectives)
        self.pruned = pruned
        self.parts = {g: transport.participants(plan.groups[g], plan.slice_ranks, pruned) for g in plan.order}
        self.communicators = 0
        self.timed = None  # a TimedReplay when the job is calibrated

    def _gate(self, comm: int, hold: bool = True, exchanges: deque | None = None) -> int:
        """The timed replay's gate (`clock`'s module doc); with `hold` (a p2p message it sends), the
        transfer hold released one real exchange early: the shortest of the last `exchanges` (ns) of this
        channel. Returns the comm's virtual floor (0: none)."""
        if self.timed is None:
            return 0
        return self.timed.gate(comm, hold, min(exchanges) if exchanges else 0)

    def _done(self, comm: int, floor: int = 0) -> None:
        if self.timed is not None:
            self.timed.complete(comm, floor)

    # -- payloads: through the prefetch pool, in the order of use -------------------------------------------
    def _path(self, digest: str) -> str:
        return str(self.payloads.dir / digest[:2] / f"{digest}.bin")

    @staticmethod
    def _read_file(path: str) -> torch.Tensor:
        return torch.frombuffer(shm.read_payload(path), dtype=torch.uint8)

    def _load(self, digest: str):
        path = self._path(digest)
        try:
            data = self.pool.get(path)
        except shm.CorruptPayload as exc:
            raise ReplayError(str(exc)) from None
        except (FileNotFoundError, RuntimeError) as exc:
            if isinstance(exc.__cause__, shm.CorruptPayload):  # loaded ahead by the pool's thread
                raise ReplayError(str(exc.__cause__)) from None
            raise ReplayError(f"payload {digest} missing from {self.payloads.dir}") from None
        self.pool.release(path)
        return shm.decode(bytearray(data.numpy()))

    def _prefetched(self, items: list, load):
        """Yield (item, load(item)) in order; loading ahead is the pool's job (its stalls are counted)."""
        for item in items:
            yield item, load(item)

    def schedule_payloads(self) -> None:
        """Tell the pool the order of use: the groups' collectives and the channels' messages, interleaved
        by position (each replay thread takes its own in order)."""
        streams = []
        for group in self.built:
            comps = self.compensators(group)
            streams.append([self.plan.payload[(v, c.key)] for c in self.plan.collectives[group]
                            for _, _, run in comps for v in run if (v, c.key) in self.plan.payload])
        streams += [list(ch.hashes) for ch in self.plan.channels]  # a receiving virtual rank reads the
        # recorded payload too (its buffers' shapes): a channel from a sandbox rank is used as well
        order = []
        for i in range(max((len(s) for s in streams), default=0)):
            order += [s[i] for s in streams if i < len(s)]
        self.pool.schedule(self._path(d) for d in order)

    def watch(self, store, spec: ZygoteSpec) -> "watchdog.ReplayWatch | None":
        """The worker's part in the hang watchdog (`watchdog.ReplayWatch`; None when it is turned off)."""
        timeout_s = watchdog.timeout_from_env()
        if timeout_s <= 0:
            return None
        sandbox = set(self.plan.slice_ranks)

        def waits() -> list[list]:
            out = []
            for who, what in sorted(self.state.items()):
                if what == "done":
                    continue
                group = who.split(" group ", 1)[1].split(" ", 1)[0] if " group " in who else who.split(" ", 1)[1]
                members = self.plan.groups.get(group, [])
                shown = ",".join(map(str, members)) if len(members) <= 16 else f"{len(members)} ranks"
                label = f"{what} ({who.split(' group ')[0]})" if who.startswith("p2p") else what
                out.append([label, f"group {group}[{shown}]", sorted(sandbox.intersection(members))])
            return out

        return watchdog.ReplayWatch(store, sorted(sandbox), timeout_s, spec.status_dir,
                                    lambda: self.ops + self.messages, waits)

    def compensators(self, group: str) -> list[tuple[int, int, list[int]]]:
        """(participant index, rank, run) of the group's compensators."""
        sandbox = set(self.plan.slice_ranks)
        return [(i, r, run) for i, (r, run) in enumerate(self.parts[group]) if r not in sandbox]

    def _build(self, group: str) -> None:
        comps = self.compensators(group)
        size = len(self.parts[group])
        self.state[f"group {group}"] = f"creating its {len(comps)} compensators " \
                                       f"(waits for the sandbox ranks to create group {group})"
        made: dict[int, ProcessGroupGloo] = {}
        failed: list[BaseException] = []

        def make(index: int, rank: int) -> None:
            try:
                made[rank] = ProcessGroupGloo(PrefixStore("gloo/", transport.emu_store(group, self.shared_store())),
                                              index, size, self.timeout)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        threads = [threading.Thread(target=make, args=(i, r), daemon=True) for i, r, _ in comps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failed:
            raise failed[0]
        self.communicators += len(made)
        self.pgs[group] = made

    def _group(self, group: str) -> None:
        name = f"group {group}"
        self._build(group)
        comps = self.compensators(group)
        members = self.plan.groups[group]
        payload = self.plan.payload

        def load(c: Collective):
            return {v: self._load(payload[(v, c.key)]) for _, _, run in comps for v in run if (v, c.key) in payload}

        wires = {i: transport.GlooWire(self.pgs[group][r]) for i, r, _ in comps}
        sandbox = set(self.plan.slice_ranks)
        pos = {m: k for k, m in enumerate(members)}
        # each collective's virtual floor goes to every sandbox participant (the sandbox's transfer hold)
        sender = transport.floor_sender(self.parts[group], sandbox)
        floor_pg = self.pgs[group][self.parts[group][sender][0]] if self.timed and sender is not None else None
        to = [i for i, p in enumerate(self.parts[group]) if comp.is_sandbox(p, sandbox)]
        for c, recorded in self._prefetched(self.plan.collectives[group], load):
            self.state[name] = f"{c.op} #{c.seq}"
            proto = pruned.Protocol(c.op, members, sandbox, self.parts[group], c.root)
            red = next((getattr(RedOp, m["reduce_op"]) for m, _ in recorded.values() if "reduce_op" in m), None)
            comm = self.timed.collective_comm.get((group, c.seq), -1) if self.timed else -1
            floor = self._gate(comm, hold=False)  # the data moves at the last virtual arrival, the hold is apart
            floor_msg = torch.tensor([floor], dtype=torch.int64)
            sent = [floor_pg.send([floor_msg], i, transport.FLOOR_TAG) for i in to] if floor_pg is not None else []
            for i, _, run in comps:  # in group order: a compensator's chain link waits for the one before
                pruned.run(proto, i, {pos[v]: recorded[v] for v in run if v in recorded}, wires[i], red)
            for wire in wires.values():
                wire.flush()
            for w in sent:
                w.wait()
            self._done(comm, floor)
            self.ops += 1
        self.state[name] = "done"

    def _channel(self, ch: Channel) -> None:
        name = f"p2p {ch.src}->{ch.dst} group {ch.group} tag {ch.tag}"
        members = self.plan.groups[ch.group]
        if not self.wait_for_group(ch.group):  # its group's compensators are being created
            return
        sandbox = set(self.plan.slice_ranks)
        parts = self.parts[ch.group]
        host = {m: i for i, (_, run) in enumerate(parts) for m in run}
        sending = ch.src not in sandbox
        virtual = ch.src if sending else ch.dst
        pg = self.pgs[ch.group][parts[host[virtual]][0]]
        n, src, dst = len(members), members.index(ch.src), members.index(ch.dst)
        tag = transport.p2p_tag(ch.tag, n, src, dst)
        exchanges: deque = deque(maxlen=EXCHANGES)
        for k, (_, (_, ts)) in enumerate(self._prefetched(ch.hashes, self._load)):
            self.state[name] = f"{'send' if sending else 'recv'} #{k}"
            comm = self.timed.message_comm(ch.group, ch.src, ch.dst, ch.tag, k) if self.timed else -1
            self._gate(comm, sending, exchanges)  # a recv completes at max(its arrival, the send's + transfer)
            if sending:
                began = time.monotonic_ns()
                pg.send(list(ts), host[ch.dst], tag).wait()
                exchanges.append(time.monotonic_ns() - began)
                with STATS_LOCK:
                    STATS["bytes_sent"] += sum(t.numel() * t.element_size() for t in ts)
            else:
                pg.recv([torch.empty_like(t) for t in ts], host[ch.src], tag).wait()
            self._done(comm)
            self.messages += 1
        self.state[name] = "done"


def _write_stream(table: pa.Table, path: Path) -> None:
    """`table` as an Arrow IPC stream at `path`, written to a temp name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    tmp.replace(path)


def progress_reporter():
    """The timed replay's progress: a line per emulated iteration of the virtual ranks' clock on the worker's
    stderr (the launcher forwards it; the sandbox ranks' own iterations are the launcher's progress bar)."""
    def report(iteration: int, done: int, iterations: int, t_s: float) -> None:
        print(f"[prism] emulation: iteration {iteration} emulated ({done}/{iterations}), {t_s:.2f} s since the "
              "common start", file=sys.stderr, flush=True)
    return report


def serve(spec: ZygoteSpec) -> int:
    """The worker's process: replay, say so (`status_dir/replay.done`), wait for SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    torch.set_num_threads(1)
    started = time.monotonic()
    capture, status_dir = Path(spec.capture), Path(spec.status_dir)
    try:
        plan = load_plan(capture, spec.ranks)
    except (ReplayError, OSError, pa.ArrowInvalid) as exc:
        print(f"[prism] emulation worker: cannot read the capture: {exc}", file=sys.stderr, flush=True)
        return 1
    worker = EmulationWorker(plan, capture, timedelta(seconds=float(spec.replay_timeout_s or 600)),
                             bool(spec.pruning), int(spec.prefetch_mb) << 20)
    worker.schedule_payloads()
    keep_until_exit(worker)  # the process ends with os._exit: tearing the gloo instances down takes seconds
    found = clock.find_artifacts(capture)
    if found is not None:
        try:
            worker.timed = clock.TimedReplay(*found, set(spec.ranks), spec.steps_limit,
                                                    progress=progress_reporter())
        except (ConeError, OSError, pa.ArrowInvalid, KeyError) as exc:
            print(f"[prism] emulation worker: cannot read the calibrated job ({found[0]}, {found[1]}): {exc}",
                  file=sys.stderr, flush=True)
            return 1
    threads = worker.start()
    store = worker.shared_store()
    watch = worker.watch(store, spec)
    if worker.timed is not None:  # before the common start, so that the sandbox ranks find it after it
        store.set(transport.OWNS_KEY, json.dumps(worker.timed.wait_owns()))  # (before the transfers: they say "timed")
        store.set(transport.TRANSFERS_KEY, json.dumps(worker.timed.collective_transfers()))
    try:  # the common start: the sandbox ranks meet the worker at their first process group
        t0_ns = common_start(store, len(spec.ranks) + 1,
                             timedelta(seconds=float(spec.replay_timeout_s or 600)),
                             stopped=lambda: stop.is_set() or bool(worker.errors))
    except (InterruptedError, TimeoutError) as exc:
        why = "; ".join(worker.errors) or str(exc)
        print(f"[prism] emulation worker stopped before the common start: {why}", file=sys.stderr, flush=True)
        if worker.timed is not None:
            worker.timed.stop()
        return 1
    if not worker.run_to_end(threads, t0_ns, stop, "emulation worker"):
        return 1
    if watch is not None:
        watch.done()
    timed = worker.timed is not None
    if timed and spec.raw_staging:  # the replayed timeline of the virtual ranks, and the real exchanges
        folder = Path(spec.raw_staging) / "replay"
        folder.mkdir(parents=True, exist_ok=True)
        _write_stream(worker.timed.table(), job_paths.stream_file(folder, "events"))
        _write_stream(worker.timed.exchanges_table(), job_paths.stream_file(folder, "exchanges"))
    summary = {"t0_ns": t0_ns, "timed": timed, "replayed_events": worker.timed.events_run if timed else 0,
               "cone": worker.timed.stats() if timed else None, "startup_s": t0_ns / 1e9 - started,
               "groups": len(worker.built),
               "communicators": worker.communicators, "collectives": worker.ops, "messages": worker.messages,
               "bytes_sent": STATS["bytes_sent"], "framing_bytes": STATS["framing_bytes"],
               "collective_messages": STATS["collective_messages"], "wall_s": time.monotonic() - started,
               "pruning": worker.pruned,
               "prefetch": dict(worker.pool.stats(), prefetch_mb=int(spec.prefetch_mb))}
    tmp = status_dir / "replay.done.tmp"
    tmp.write_text(json.dumps(summary))
    tmp.replace(status_dir / "replay.done")
    while not stop.wait(0.1):
        pass
    return 0
