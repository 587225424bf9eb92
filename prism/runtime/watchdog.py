"""Real mode's hang watchdog: a skipped collective or a send/send deadlock is named within seconds.

Capture sees every rank's communication and names a hang as soon as no rank can run. In real mode the
ranks talk through gloo/NCCL, which would wait for their own timeout (30 min) without a word. So each rank
keeps, off its hot path, the ops it issued that have not completed (polled by a helper thread) and the last
op it issued per group. A rank is *stuck* when it has ops outstanding and for `timeout_s` seconds none of
them completed, it issued none, and its program's thread used no CPU (it waits; it does not compute). A
stuck rank publishes what it waits for in the job's store (the rendezvous TCPStore every rank already
shares) and reads every rank's state. When every rank is stuck or has exited, the job hangs: one rank
(elected through the store) writes the diagnosis — which ranks wait in which group, op, sequence number and
shape, in the words capture uses — to the launcher's status folder; the launcher stops every rank at once,
prints it and exits with `HANG_EXIT_CODE`. A rank that computes is never stuck, so a long compute phase of
one rank (even with async ops in flight) does not turn the others' waits into a hang.

In emulate the sandbox ranks' peers are the virtual ranks, all played by one replay worker: the worker
takes part in the same rule (`ReplayWatch`): it publishes what it waits on when none of its ops completed
for the timeout, and the verdict needs it stuck (or done) too; then whichever of them sees the verdict
first (the worker when the sandbox ranks merely sleep) reports it.

The timeout: `PRISM_HANG_TIMEOUT` seconds (`prism launch --hang-timeout S`; default 60; 0 turns it off).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import weakref
from collections import deque

from prism import settings

HANG_EXIT_CODE = 86  # the job would hang (capture: no rank can run; real: every rank stuck): documented
ENV = settings.HANG_TIMEOUT.name
DEFAULT_TIMEOUT_S = 60.0
REPORT = "hang.txt"  # in the launcher's status folder (PRISM_STATUS_DIR)
_KEY = "prism-watchdog/"
REPLAY_KEY = _KEY + "replay"  # emulate: the replay worker's state (`ReplayWatch`)
COMPUTING_CPU_FRACTION = 0.02  # the program's thread used more CPU than this share of a poll: it computes
STOP_WAIT_S = 30.0  # how long the reporting rank waits to be stopped by the launcher before it exits itself

active: "Watchdog | None" = None  # this rank's watchdog (real mode), fed by the backend


def timeout_from_env(environ=os.environ) -> float:
    """The hang timeout in seconds (0: off). Raises ValueError naming the variable on a bad value."""
    text = (settings.HANG_TIMEOUT.raw(environ) or "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r} is not a number of seconds (0 turns the watchdog off)") from None
    if value < 0 or value != value:
        raise ValueError(f"{ENV}={text!r}: the hang timeout must be >= 0 seconds (0 turns the watchdog off)")
    return value


def start(store, rank: int, world: int, ranks: list[int] | None = None,
          replayed: bool = False) -> "Watchdog | None":
    """Start this rank's watchdog over the job's store (once; None when turned off). `ranks`: the ranks that
    run for real and watch each other (default all `world`; a slice run: the slice's, the replay server
    answering for the others). `replayed`: a replay worker takes part in the rule (emulate, `ReplayWatch`)."""
    global active
    if active is None:
        timeout_s = timeout_from_env()
        if timeout_s > 0:
            active = Watchdog(store, rank, world, timeout_s, settings.STATUS_DIR.get(), ranks, replayed)
    return active


def stop() -> None:
    """The rank finished: tell the others (an exited rank is not waited for)."""
    if active is not None:
        active.exited()


class Watchdog:
    def __init__(self, store, rank: int, world: int, timeout_s: float, status_dir: str | None,
                 ranks: list[int] | None = None, replayed: bool = False) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.replayed = replayed
        self.ranks = list(ranks) if ranks is not None else list(range(world))  # the ranks that watch
        self.timeout_s = timeout_s
        self.status_dir = status_dir
        self.poll_s = min(1.0, timeout_s / 4)
        self.issued_q: deque = deque()  # (work, op info), appended by the program's thread
        self.pending: list[tuple] = []  # outstanding (work, info), oldest first (the helper thread's)
        self.last: dict[str, tuple] = {}  # group -> info of the last op issued on it
        self.groups: dict[str, tuple] = {}  # group -> (desc, members)
        self.last_issue = time.monotonic()
        self.last_progress = self.last_issue
        try:  # the program's thread computing (using CPU) is progress too, whatever it has outstanding
            self._clock = time.pthread_getcpuclockid(threading.main_thread().ident)
            self._cpu = time.clock_gettime(self._clock)
        except (AttributeError, OSError):
            self._clock = None
        self.published: str | None = None
        self.done = False
        self._thread = threading.Thread(target=self._run, name="prism-watchdog", daemon=True)
        self._thread.start()

    # -- the program's thread (the backend's hook) --------------------------------------------------------
    def issued(self, pg, work, op: str, group_seq: int, peer: int, tag: int, dtype, shape) -> None:
        name = pg._name
        if name not in self.groups:
            self.groups[name] = (pg._desc, list(pg._global_ranks))
        info = (name, op, group_seq, peer, tag, dtype, shape)
        self.last[name] = info
        # a weak reference: the op's tensors must not outlive the program's use of them (memory fidelity)
        self.issued_q.append((weakref.ref(work), info))
        self.last_issue = time.monotonic()

    def exited(self) -> None:
        self.done = True
        self._publish("exited", [])

    # -- the helper thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self.done:
            time.sleep(self.poll_s)
            try:
                self._check()
            except Exception as exc:  # noqa: BLE001 - the watchdog must never break the program
                print(f"[prism] rank {self.rank}: hang watchdog stopped: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
                return

    def _check(self) -> None:
        while self.issued_q:
            self.pending.append(self.issued_q.popleft())
        still = [(w, info) for w, info in self.pending if (op := w()) is not None and not op.is_completed()]
        now = time.monotonic()
        if len(still) < len(self.pending) or self._computing():
            self.last_progress = now
        self.pending = still
        progress = max(self.last_progress, self.last_issue)
        if not self.pending or now - progress < self.timeout_s:
            # idle: nothing outstanding, yet no op and no compute for the timeout (it sleeps, or waits outside
            # communication): a peer stuck on it hangs too; an idle rank itself never declares
            state = "idle" if not self.pending and now - progress >= self.timeout_s else "running"
            if state != self.published and (state == "idle" or self.published in ("stuck", "idle")):
                self._publish(state, [])
            return
        waits = [info for _, info in self.pending[:16]]
        if self.published != "stuck":
            self._publish("stuck", waits)
        states = self._states()
        if states is None:  # the store is gone (its host, rank 0, died): say what this rank knows
            self._declare({self.rank: self._state("stuck", waits)}, "the job's store is unreachable")
        elif all(s["state"] in ("stuck", "exited", "idle") for s in states.values()) and len(states) == len(self.ranks):
            replay = replay_state(self.store) if self.replayed else None
            if self.replayed and (replay is None or replay["state"] not in ("stuck", "done")):
                return  # the replay worker still makes progress (or has not said): no verdict yet
            if self.store.add(_KEY + "verdict", 1) == 1:  # one rank reports
                self._declare(states, None, replay)

    def _computing(self) -> bool:
        """Whether the program's thread used CPU since the last check (a thread blocked in a wait uses none)."""
        if self._clock is None:
            return False
        cpu = time.clock_gettime(self._clock)
        used, self._cpu = cpu - self._cpu, cpu
        return used > COMPUTING_CPU_FRACTION * self.poll_s

    def _state(self, state: str, waits: list) -> dict:
        return {"rank": self.rank, "state": state, "waits": waits, "last": dict(self.last),
                "groups": dict(self.groups), "idle_s": time.monotonic() - max(self.last_progress, self.last_issue)}

    def _publish(self, state: str, waits: list) -> None:
        self.published = state
        try:
            self.store.set(_KEY + str(self.rank), json.dumps(self._state(state, waits)))
        except Exception:  # noqa: BLE001 - the store is gone: _check reports what it can
            pass

    def _states(self) -> dict[int, dict] | None:
        return states_of(self.store, self.ranks)

    def _declare(self, states: dict[int, dict], note: str | None, replay: dict | None = None) -> None:
        text = diagnose(states, len(self.ranks), self.timeout_s, note, replay)
        if self.status_dir:  # the launcher stops every rank at once (no rank sees a peer vanish first)
            write_report(self.status_dir, text, str(self.rank))
            time.sleep(STOP_WAIT_S)
        else:  # not under prism launch: say it here
            print(f"[prism] hang: {text}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(HANG_EXIT_CODE)


def states_of(store, ranks: list[int]) -> dict[int, dict] | None:
    """Every rank's published state (ranks that published none are missing); None: the store is gone."""
    out = {}
    try:
        for r in ranks:
            key = _KEY + str(r)
            if store.check([key]):
                out[r] = json.loads(store.get(key))
    except Exception:  # noqa: BLE001 - connection refused / reset: the store's host is gone
        return None
    return out


def replay_state(store) -> dict | None:
    """The replay worker's published state (emulate), None when it published none."""
    try:
        return json.loads(store.get(REPLAY_KEY)) if store.check([REPLAY_KEY]) else None
    except Exception:  # noqa: BLE001 - the store is gone
        return None


def write_report(status_dir: str, text: str, who: str) -> None:
    """The diagnosis, where the launcher looks for it (it then stops every process of the job)."""
    tmp = os.path.join(status_dir, f".{REPORT}.{who}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(status_dir, REPORT))


class ReplayWatch:
    """The replay worker's part in the rule (emulate): every poll it compares `progress()` (ops it completed)
    with the last; when it did not move for the timeout while `waits()` is not empty (each wait: [what,
    on which group, the sandbox ranks it waits for]), it publishes itself stuck; when the sandbox ranks are
    all stuck, idle or exited too, the job hangs and it reports (the launcher stops every process)."""

    def __init__(self, store, sandbox: list[int], timeout_s: float, status_dir: str | None, progress, waits) -> None:
        self.store, self.sandbox, self.timeout_s, self.status_dir = store, list(sandbox), timeout_s, status_dir
        self.progress, self.waits = progress, waits
        self.poll_s = min(1.0, timeout_s / 4)
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prism-replay-watchdog", daemon=True)
        self._thread.start()

    def done(self) -> None:
        """Everything replayed: the worker waits for nothing."""
        self.finished.set()
        self._publish({"state": "done", "waits": []})

    def _publish(self, state: dict) -> None:
        try:
            self.store.set(REPLAY_KEY, json.dumps(state))
        except Exception:  # noqa: BLE001 - the store is gone: the launcher sees the job end
            pass

    def _run(self) -> None:
        last, since, published = self.progress(), time.monotonic(), "running"
        while not self.finished.wait(self.poll_s):
            try:
                now, seen = time.monotonic(), self.progress()
                if seen != last:
                    last, since = seen, now
                waits = self.waits()
                if not waits or now - since < self.timeout_s:
                    if published == "stuck":
                        published = "running"
                        self._publish({"state": "running", "waits": []})
                    continue
                state = {"state": "stuck", "waits": waits[:16], "idle_s": now - since}
                self._publish(state)
                published = "stuck"
                states = states_of(self.store, self.sandbox)
                if states is None or len(states) < len(self.sandbox):
                    continue
                if all(s["state"] in ("stuck", "exited", "idle") for s in states.values()) \
                        and self.store.add(_KEY + "verdict", 1) == 1:
                    text = diagnose(states, len(self.sandbox), self.timeout_s, None, state)
                    if self.status_dir:
                        write_report(self.status_dir, text, "replay")
                    else:
                        print(f"[prism] hang: {text}", file=sys.stderr, flush=True)
                    return
            except Exception as exc:  # noqa: BLE001 - the watchdog must never break the replay
                print(f"[prism] replay worker: hang watchdog stopped: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
                return


# -- the diagnosis (pure: states in, text out) ------------------------------------------------------------
def _ranges(ranks) -> str:
    ranks = sorted(ranks)
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def _who(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"


def _label(groups: dict, name: str) -> str:
    desc, members = groups.get(name, (None, []))
    shown = ",".join(map(str, members)) if len(members) <= 16 else \
        f"{','.join(map(str, members[:8]))},...({len(members)} ranks)"
    return f"{desc if desc and desc != 'undefined' else f'group {name}'}[{shown}]"


def _sig(info) -> str:
    return f"{info[5]}[{info[6]}]" if info[5] else ""


def _op_text(info, groups: dict) -> str:
    name, op, seq, peer, tag = info[:5]
    on = _label(groups, name)
    if op in ("send", "isend"):
        return f"send to rank {peer} (tag {tag}) on {on}"
    if op == "recv_anysource":
        return f"receive from any rank (tag {tag}) on {on}"
    if op in ("recv", "irecv"):
        return f"receive from rank {peer} (tag {tag}) on {on}"
    return f"{op} #{seq} on {on}"


def _doing(rank: int, states: dict[int, dict], groups: dict) -> str:
    s = states.get(rank)
    if s is None:
        return f"rank {rank} is running (it reported no wait)"
    if s["state"] == "exited":
        return f"rank {rank} has exited"
    if s["state"] == "idle":
        return (f"rank {rank} is idle (no op and no compute for {s.get('idle_s', 0):.0f} s: it sleeps or waits "
                "outside communication)")
    if s["state"] == "running" or not s["waits"]:
        return f"rank {rank} is running"
    first = s["waits"][0]
    sig = _sig(first)
    return f"rank {rank} waits in {_op_text(first, groups)}{' (' + sig + ')' if sig else ''}"


def diagnose(states: dict[int, dict], world: int, timeout_s: float, note: str | None = None,
             replay: dict | None = None) -> str:
    """The message: one line per stuck communication, like capture's (which ranks wait where, with what);
    `replay`: the replay worker's state (emulate), its waits named with the sandbox ranks they wait for."""
    groups: dict[str, tuple] = {}
    for s in states.values():
        groups.update({k: tuple(v) for k, v in s["groups"].items()})
    head = (f"no op completed on any rank for {timeout_s:g} s while every rank waited (the job hangs; "
            "--hang-timeout S waits longer)")
    lines = [head + (f"; {note}" if note else "") + ":"]
    collectives: dict[tuple, dict[int, list]] = {}
    described = set()  # (rank, op) already named, as a peer's partner (a send/send deadlock: one line)
    for rank, s in sorted(states.items()):
        if s["state"] != "stuck":
            continue
        for info in s["waits"]:
            name, op, seq, peer = info[0], info[1], info[2], info[3]
            if seq >= 0:
                collectives.setdefault((name, seq), {})[rank] = info
                continue
            if (rank, tuple(info)) in described:
                continue
            line = f"  rank {rank} waits in {_op_text(info, groups)} ({_sig(info)})"
            if op != "recv_anysource":
                line += "; " + _doing(peer, states, groups)
                partner = states.get(peer)
                if partner and partner["state"] == "stuck" and partner["waits"]:
                    described.add((peer, tuple(partner["waits"][0])))
            lines.append(line)
    for (name, seq), arrived in sorted(collectives.items()):
        members = groups.get(name, (None, []))[1]
        ops = [info[1] for info in arrived.values()]
        op = max(set(ops), key=ops.count)
        show_op = len(set(ops)) > 1
        by_sig: dict[str, list[int]] = {}
        for r, info in sorted(arrived.items()):
            by_sig.setdefault(f"{info[1] + ' ' if show_op else ''}{_sig(info)}", []).append(r)
        parts = ["; ".join(f"{_who(rs)} wait{'s' if len(rs) == 1 else ''} with {sig}" for sig, rs in by_sig.items())]
        missing = [m for m in members if m not in arrived]
        parts += [_doing(m, states, groups) for m in missing[:8]]
        if len(missing) > 8:
            parts.append(f"... ({len(missing)} ranks missing)")
        why = " (ops differ: a rank skipped or reordered a collective on this group)" if show_op else ""
        prefix = "collective mismatch at " if show_op else ""
        lines.append(f"  {prefix}{op} #{seq} on {_label(groups, name)}{why}: " + "; ".join(parts))
    for what, on, sandbox in (replay or {}).get("waits", []) if (replay or {}).get("state") == "stuck" else []:
        doing = "; ".join(_doing(r, states, groups) for r in sandbox[:8]) or "no sandbox rank"
        lines.append(f"  the replay worker (the virtual ranks) waits in {what} on {on} for sandbox "
                     f"{_who(sandbox) if sandbox else 'ranks'}: {doing}")
    exited = [r for r, s in states.items() if s["state"] == "exited"]
    if exited and len(exited) < world:
        lines.append(f"  finished ranks: {_ranges(exited)}")
    return "\n".join(lines)
