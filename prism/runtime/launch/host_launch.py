"""`prism launch --nnodes N --node-rank K ...`: one host's launcher of a capture or an emulation spread over hosts.

The steps around the one-host launch (`launcher._run`), in order: this host's share checked against the
machine (`limits`), host 0 claims `--out` and serves the store, the rendezvous (`hosts.join`: every host, or
one error naming the host that failed, on every host, before any rank starts), the run (the zygote with this
host's ranks, its coordinator linked to the others by `host_bridge`), then the end: every host reports its
exit; host 0 moves every host's staged rank files into one raw/ (and payloads/) and publishes them only when
every host succeeded; the other hosts wait for that verdict. A failed host's launcher exits at once with its
code (its peers have heard from its coordinator, or see its link break).

An emulation (`--mode emulate`) takes the same steps: its share is its block's sandbox ranks (host 0: and the
replay worker), the launchers also exchange clocks after the rendezvous (`hosts.sync_clocks`: the sandbox
ranks' times and the worker's floors are host monotonic times), the zygotes watch each other's end
(`host_watch`), and host 0 also merges the other hosts' sandbox logs and their ranks' transport numbers.
"""

from __future__ import annotations

import shutil
import sys
import uuid

from prism import settings
from prism.runtime import modes
from prism.runtime.launch import hosts, limits, run_files
from prism.runtime.launch.launch_spec import LaunchError, LaunchSpec


class HostsRun:
    """What `launcher._run` needs to know about the other hosts."""

    def __init__(self, view: hosts.HostView, store, records: list[dict], run_id: str, out,
                 clocks: dict[int, dict] | None = None) -> None:
        self.view, self.store, self.records, self.run_id, self.out = view, store, records, run_id, out
        self.clocks = clocks or {}  # an emulation: the hosts' monotonic clocks against host 0's (`sync_clocks`)

    def rank_env(self) -> dict[str, str]:
        """What this host's processes need beyond torchrun's view: an emulation's clock offset to host 0."""
        mine = self.clocks.get(self.view.node_rank)
        return {settings.CLOCK_OFFSET_NS.name: str(mine["clock_offset_ns"])} if mine else {}

    def zygote_spec(self) -> dict:
        v = self.view
        return {"nproc": v.world, "master_addr": v.master_addr, "master_port": v.master_port,
                "hosts": v.as_dict(), "host_records": self.records}

    def staging_suffix(self) -> str:
        return f"-h{self.view.node_rank}"

    def meta(self) -> dict:
        """meta.json's additions: the hosts, and each rank's host (`graph` reads `nodes` into ranks.node)."""
        names = hosts.node_names(self.records)
        return {"world_size": self.view.world, "nnodes": self.view.nnodes,
                "hosts": [{**{k: h[k] for k in ("node_rank", "hostname", "ranks", "slots")},
                           **self.clocks.get(h["node_rank"], {})} for h in self.records],
                "nodes": {str(r): n for r, n in names.items()}}

    def finish(self, code: int, staging, payload_staging, publish, log_staging=None, status_dir=None) -> int:
        """Every host reports its end; host 0 merges every host's staging and publishes once all succeeded
        (an emulation's: also the other hosts' sandbox logs, and their ranks' numbers for meta.json)."""
        v = self.view
        if code == 0 and v.node_rank != 0 and staging is not None and status_dir is not None:
            for stats in status_dir.glob(f"{hosts.STATS_PREFIX}*.json"):  # to host 0, through --out
                shutil.move(stats, staging / stats.name)
        hosts.report_exit(self.store, v, code, staging, payload_staging, log_staging)
        if code != 0:
            if v.node_rank == 0:
                hosts.announce_result(self.store, v, code, wait=False)
                self._sweep_other_hosts()
            return code
        if v.node_rank != 0:
            return hosts.await_result(self.store, v)
        exits = hosts.gather_exits(self.store, v)
        bad = [(k, e) for k, e in enumerate(exits) if e["code"] != 0]
        if bad:
            for k, e in bad:
                why = e.get("error") or f"exit code {e['code']}"
                print(f"[prism] host {k} ({self.records[k]['hostname']}) failed ({why}): the capture is not "
                      "published", file=sys.stderr)
            hosts.announce_result(self.store, v, bad[0][1]["code"])
            self._sweep_other_hosts()
            return bad[0][1]["code"]
        if staging is not None:
            hosts.merge_into(staging, payload_staging, exits, 0, log_staging, status_dir)
            publish()
        hosts.announce_result(self.store, v, 0)
        return 0


    def _sweep_other_hosts(self) -> None:
        """Host 0, the job failed: the other hosts' staging folders of this run go too (a host that died
        could not remove its own)."""
        if self.out is None or not self.out.is_dir():
            return
        for entry in self.out.iterdir():
            if (entry.name.startswith((".raw.tmp-", ".payloads.tmp-", ".logs.tmp-")) and self.run_id[:8] in entry.name
                    and not entry.name.endswith("-h0")):
                shutil.rmtree(entry, ignore_errors=True)


def prepare(spec: LaunchSpec, limit_error: str | None) -> tuple[HostsRun, str, run_files.OutFolder | None]:
    """Serve or reach the store, claim --out (host 0), meet every host. Returns (the run, run id, out)."""
    try:
        timeout = hosts.timeout_from_env()
    except hosts.HostError as exc:
        raise LaunchError(str(exc)) from None
    view = hosts.HostView(spec.nnodes, spec.node_rank, spec.nproc, spec.master_addr, spec.master_port, timeout)
    try:
        store = hosts.connect(view)
    except hosts.HostError as exc:
        raise LaunchError(str(exc)) from None
    out = None
    run_id = None
    if view.node_rank == 0:
        run_id = uuid.uuid4().hex
        if limit_error is None:
            try:
                out = run_files.OutFolder(spec.out, spec.force)
            except run_files.OutError as exc:
                limit_error = str(exc)
    try:
        run_id, records = hosts.join(store, view, run_id, limit_error, spec.devices or 0, spec.out)
    except hosts.HostError as exc:
        if out is not None:
            out.release(failed=True)
        raise LaunchError(str(exc)) from None
    clocks = None
    if modes.get(spec.mode).sandbox:  # the emulation's one clock: each host's offset to host 0's
        try:
            clocks = hosts.sync_clocks(store, view)
        except hosts.HostError as exc:
            if out is not None:
                out.release(failed=True)
            raise LaunchError(str(exc)) from None
    return HostsRun(view, store, records, run_id, spec.out, clocks), run_id, out


def local_sandbox(spec: LaunchSpec) -> list[int]:
    """An emulation over hosts: the sandbox ranks this host runs (those of its block of --nproc ranks)."""
    return [r for r in spec.slice_ranks if r // spec.nproc == spec.node_rank]


def share_error(spec: LaunchSpec, shm_root: str) -> str | None:
    """Whether this host's share fits the machine (capture: its --nproc ranks; emulate: its sandbox ranks, and
    on host 0 the replay worker): the limit's message, or None."""
    sandbox = modes.get(spec.mode).sandbox
    share = len(local_sandbox(spec)) + (spec.node_rank == 0) if sandbox else spec.nproc
    try:
        limits.check_start(share, spec.mode, None if sandbox else shm_root)
    except limits.LimitError as exc:
        return str(exc)
    return None
