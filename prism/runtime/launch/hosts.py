"""A capture or an emulation spread over hosts: the host view of the job and the launchers' torchrun-style
rendezvous (an emulation: also their clock exchange, `sync_clocks`).

    host 0:  prism launch --nnodes 2 --node-rank 0 --master-addr H0 --master-port 29500 --nproc 4 --mode capture --out JOB ...
    host 1:  prism launch --nnodes 2 --node-rank 1 --master-addr H0 --master-port 29500 --nproc 4 --mode capture --out JOB ...

As with torchrun, `--nproc` is the ranks of one host: host K runs global ranks K*nproc .. (K+1)*nproc-1 on its
own `--devices` slots, under its own coordinator; W = nnodes*nproc. Host 0's launcher hosts the job's TCPStore
at MASTER_ADDR:MASTER_PORT (the ranks' rendezvous, as in a one-host capture, and this one); the coordinators
of the hosts join a gloo group of their own over it (`prism.runtime.capture.host_bridge`), through which
every contribution a rank of another host reads travels (gloo/TCP: no data through the store).

The rendezvous (`join`): every launcher posts what it is (hostname, ranks, slots) and whether its share fits
the machine (`limits.check_start`: open files, processes, memory, /dev/shm) and waits for every host; a host
that never comes, or whose share does not fit, makes every launcher stop before any rank starts, with one
message naming the host and the limit. `--out` must be one folder every host sees (a shared file system, as
on a cluster): host 0 owns it (lock, emptiness), every host stages its ranks' files there, and host 0 puts
the job's raw/ and payloads/ in place once every host succeeded (`finish`), so the artifacts are those of a
one-host capture, plus `meta.json`'s `hosts` and `nodes` (rank -> host: the graph's `ranks.node`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from prism import settings

PREFIX = "prism/hosts/"
DEFAULT_TIMEOUT_S = settings.RDZV_TIMEOUT.default  # the launcher's wait for the other hosts
ENV_TIMEOUT = settings.RDZV_TIMEOUT.name
STATS_PREFIX = "emulate-rank"  # a sandbox rank's transport numbers in the status folder (`emulate.transport`)
ACK_S = 30.0  # how long host 0 keeps the store up for the other hosts to read the verdict


class HostError(Exception):
    """The hosts of a job cannot run it together: the message names the host and the cause."""


@dataclass(frozen=True)
class HostView:
    """Which host this launcher is and which global ranks each host runs (contiguous blocks, torchrun's)."""

    nnodes: int
    node_rank: int
    nproc: int  # ranks a host
    master_addr: str
    master_port: int
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc

    @property
    def first(self) -> int:
        return self.node_rank * self.nproc

    def ranks(self, host: int | None = None) -> range:
        host = self.node_rank if host is None else host
        return range(host * self.nproc, (host + 1) * self.nproc)

    def host_of(self, rank: int) -> int:
        return rank // self.nproc

    def as_dict(self) -> dict:
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "nproc": self.nproc,
                "master_addr": self.master_addr, "master_port": self.master_port, "timeout_s": self.timeout_s}

    @classmethod
    def from_dict(cls, d: dict) -> "HostView":
        return cls(**d)


def timeout_from_env() -> float:
    text = os.environ.get(ENV_TIMEOUT)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise HostError(f"{ENV_TIMEOUT}={text!r}: give seconds (e.g. 120)") from None
    if not value > 0:
        raise HostError(f"{ENV_TIMEOUT}={text!r}: give a positive number of seconds")
    return value


def connect(view: HostView):
    """Host 0: start the job's store (the ranks' too); other hosts: reach it. Returns the store."""
    import torch.distributed as dist

    where = f"{view.master_addr}:{view.master_port}"
    try:
        return dist.TCPStore(view.master_addr, view.master_port, view.world, is_master=view.node_rank == 0,
                             wait_for_workers=False, timeout=timedelta(seconds=view.timeout_s))
    except (RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if view.node_rank == 0:
            raise HostError(f"host 0 ({socket.gethostname()}) cannot serve the rendezvous at {where}: {first} "
                            "(is the port in use? choose another --master-port)") from None
        raise HostError(f"host {view.node_rank} ({socket.gethostname()}) could not reach the rendezvous at {where} "
                        f"within {view.timeout_s:g} s: {first}. Start host 0 with the same --master-addr/"
                        f"--master-port (and --nnodes {view.nnodes}), or raise {ENV_TIMEOUT}") from None


def _wait(store, view: HostView, keys: list[str], what: str) -> None:
    """Wait for keys `PREFIX + k`; on timeout name the hosts whose key never came."""
    try:
        store.wait([PREFIX + k for k in keys], timedelta(seconds=view.timeout_s))
    except (RuntimeError, OSError):
        missing = [k for k in keys if not store.check([PREFIX + k])]
        hosts = sorted({int(k.rsplit("/", 1)[1]) for k in missing})
        raise HostError(f"the hosts' rendezvous at {view.master_addr}:{view.master_port} did not complete in "
                        f"{view.timeout_s:g} s: host(s) {', '.join(map(str, hosts))} of {view.nnodes} never "
                        f"{what} (start one launcher per host with --nnodes {view.nnodes} and node ranks "
                        f"0..{view.nnodes - 1}, or raise {ENV_TIMEOUT})") from None


def join(store, view: HostView, run_id: str | None, limit_error: str | None, slots: int,
         out: Path | None) -> tuple[str, list[dict]]:
    """Every host posts itself and waits for the others. Returns (the job's run id, every host's record).
    Raises HostError if a host does not come, or some host's share does not fit it (naming it)."""
    me = view.node_rank
    if me == 0:
        store.set(PREFIX + "run_id", run_id)
        store.set(PREFIX + "out", str(out.resolve()) if out is not None else "")
    else:
        _wait(store, view, ["host/0"], "joined")
        run_id = store.get(PREFIX + "run_id").decode()
        theirs = store.get(PREFIX + "out").decode()
        from prism.runtime.launch.run_files import LOCK_NAME

        if out is not None and theirs and not (out.resolve() / LOCK_NAME).exists():
            limit_error = limit_error or (f"--out {out} is not the folder host 0 writes ({theirs}): every host "
                                          "must see one --out (a shared file system)")
    record = {"node_rank": me, "hostname": socket.gethostname(), "ranks": [view.first, view.first + view.nproc],
              "slots": slots, "pid": os.getpid(), "error": limit_error}
    store.set(PREFIX + f"host/{me}", json.dumps(record))
    _wait(store, view, [f"host/{k}" for k in range(view.nnodes)], "joined")
    hosts = [json.loads(store.get(PREFIX + f"host/{k}")) for k in range(view.nnodes)]
    bad = [h for h in hosts if h["error"]]
    if bad:
        raise HostError("; ".join(f"host {h['node_rank']} ({h['hostname']}): {h['error']}" for h in bad)
                        + ". No rank was started on any host")
    return run_id, hosts


CLOCK_ROUNDS = 16  # the clock exchange's round trips a host (the shortest one is kept)


def sync_clocks(store, view: HostView, clock: Callable[[], int] = time.monotonic_ns) -> dict[int, dict]:
    """An emulation over hosts: each host's monotonic clock against host 0's (Cristian's exchange over the
    store: host K stamps t1, posts a ping, host 0 answers with its clock, host K stamps t2; of CLOCK_ROUNDS
    round trips the shortest gives offset = (t1 + t2) / 2 - host 0's answer, within +- its round trip / 2).
    The sandbox ranks' common start and the worker's floors are host monotonic times (`emulate.common_start`),
    which differ between machines. Returns {host: {"clock_offset_ns", "clock_rtt_ns"}} (host 0: every host's;
    the others: their own). `clock`: this host's monotonic clock (a test shifts it)."""
    me, wait = view.node_rank, timedelta(seconds=view.timeout_s)
    try:
        if me == 0:
            for k in range(1, view.nnodes):
                for i in range(CLOCK_ROUNDS):
                    store.wait([PREFIX + f"clock/{k}/{i}/ping"], wait)
                    store.set(PREFIX + f"clock/{k}/{i}/pong", str(clock()))
            store.wait([PREFIX + f"clock/{k}" for k in range(1, view.nnodes)], wait)
            got = {k: json.loads(store.get(PREFIX + f"clock/{k}")) for k in range(1, view.nnodes)}
            return {0: {"clock_offset_ns": 0, "clock_rtt_ns": 0}, **got}
        best = None
        for i in range(CLOCK_ROUNDS):
            t1 = clock()
            store.set(PREFIX + f"clock/{me}/{i}/ping", "1")
            store.wait([PREFIX + f"clock/{me}/{i}/pong"], wait)
            t2 = clock()
            theirs = int(store.get(PREFIX + f"clock/{me}/{i}/pong"))
            if best is None or t2 - t1 < best[0]:
                best = (t2 - t1, (t1 + t2) // 2 - theirs)
        mine = {"clock_offset_ns": best[1], "clock_rtt_ns": best[0]}
        store.set(PREFIX + f"clock/{me}", json.dumps(mine))
        return {me: mine}
    except (RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HostError(f"host {me} ({socket.gethostname()}): the hosts' clock exchange through "
                        f"{view.master_addr}:{view.master_port} did not complete in {view.timeout_s:g} s ({first}): "
                        f"a host stopped after the rendezvous; start again, or raise {ENV_TIMEOUT}") from None


def node_names(hosts: list[dict]) -> dict[int, str]:
    """rank -> its host's name (hostname, or hostname#K where two hosts share one, as on localhost)."""
    names = [h["hostname"] for h in hosts]
    out = {}
    for h in hosts:
        name = h["hostname"] if names.count(h["hostname"]) == 1 else f"{h['hostname']}#{h['node_rank']}"
        out.update({r: name for r in range(*h["ranks"])})
    return out


def report_exit(store, view: HostView, code: int, staging: Path | None, payloads: Path | None,
                logs: Path | None = None) -> None:
    try:
        store.set(PREFIX + f"exit/{view.node_rank}", json.dumps(
            {"code": code, "staging": str(staging) if staging else None, "payloads": str(payloads) if payloads else None,
             "logs": str(logs) if logs else None}))
    except (RuntimeError, OSError):
        pass  # host 0 (the store) is gone: nothing is published, this host exits with its own code


def gather_exits(store, view: HostView) -> list[dict]:
    """Host 0: every host's exit record (a host that never reports is a failure naming it)."""
    try:
        _wait(store, view, [f"exit/{k}" for k in range(view.nnodes)], "reported the end of its ranks")
    except HostError as exc:
        got = []
        for k in range(view.nnodes):
            key = PREFIX + f"exit/{k}"
            got.append(json.loads(store.get(key)) if store.check([key]) else {"code": 1, "error": str(exc)})
        return got
    return [json.loads(store.get(PREFIX + f"exit/{k}")) for k in range(view.nnodes)]


def announce_result(store, view: HostView, code: int, wait: bool = True) -> None:
    """Host 0: the job's verdict; it then serves the store until every host read it (or ACK_S passed)."""
    store.set(PREFIX + "result", str(code))
    if not wait:
        return
    try:
        store.wait([PREFIX + f"ack/{k}" for k in range(1, view.nnodes)], timedelta(seconds=ACK_S))
    except (RuntimeError, OSError):
        pass  # a host that stopped reading: it exits with its own code


def await_result(store, view: HostView) -> int:
    """Other hosts: host 0's verdict on the job (once it published, or gave up)."""
    try:
        store.wait([PREFIX + "result"], timedelta(seconds=view.timeout_s))
        code = int(store.get(PREFIX + "result"))
        store.set(PREFIX + f"ack/{view.node_rank}", "1")
        return code
    except (RuntimeError, OSError):
        return 1  # host 0 went away: the job is not published


def merge_into(final_raw: Path, final_payloads: Path | None, exits: list[dict], me: int,
               final_logs: Path | None = None, status_dir: Path | None = None) -> None:
    """Host 0: move the other hosts' rank folders and payload files into its own staging (renames; a payload
    already there is the same content, `shm.PayloadStore` names a file by its hash); an emulation's: also
    their sandbox ranks' logs, and their transports' numbers (`emulate-rank*.json`) into `status_dir`."""
    for k, rec in enumerate(exits):
        if k == me:
            continue
        staging = Path(rec["staging"]) if rec.get("staging") else None
        if staging is not None and staging.is_dir():
            for entry in staging.iterdir():
                if entry.name.startswith("rank="):
                    os.replace(entry, final_raw / entry.name)
                elif status_dir is not None and entry.name.startswith(STATS_PREFIX):
                    os.replace(entry, status_dir / entry.name)
        logs = Path(rec["logs"]) if rec.get("logs") else None
        if final_logs is not None and logs is not None and logs.is_dir():
            for entry in logs.iterdir():
                os.replace(entry, final_logs / entry.name)
        payloads = Path(rec["payloads"]) if rec.get("payloads") else None
        if final_payloads is not None and payloads is not None and payloads.is_dir():
            for sub in payloads.iterdir():
                target = final_payloads / sub.name
                target.mkdir(exist_ok=True)
                for f in sub.iterdir():
                    if not (target / f.name).exists():
                        os.replace(f, target / f.name)
            shutil.rmtree(payloads, ignore_errors=True)
