"""An emulation over hosts, in each host's zygote: the hosts watch each other's end.

The sandbox ranks and the replay worker (on host 0) talk through their own gloo groups over the job's store,
as on one host; what a host needs from the others is only how they end. That goes through the capture's
bridge (`capture.host_bridge`: the zygotes' gloo group, one TCP pair between two hosts), here carrying no
data: "bye" (this host's ranks all finished), "fail" (it stopped them, and why), or a broken link (the host
or its launcher died), each named once by host. Host 0 stops its replay worker only once every other host
said bye (`others_done`): a sandbox rank of another host may still be running.
"""

from __future__ import annotations

import time
from datetime import timedelta


class HostWatch:
    def __init__(self, hosts: dict, records: list[dict]) -> None:
        import torch.distributed as dist

        from prism.runtime.capture.host_bridge import HostBridge
        from prism.runtime.launch.hosts import HostView

        self.view = HostView.from_dict(hosts)
        self.store = dist.TCPStore(self.view.master_addr, self.view.master_port, is_master=False,
                                   wait_for_workers=False, timeout=timedelta(seconds=self.view.timeout_s))
        self.bridge = HostBridge(self.store, self.view, records, None)
        self.error: str | None = None

    def poll(self) -> str | None:
        """The first other host's failure or loss heard of so far (None: none)."""
        for msg in self.bridge.drain():
            why = self.bridge.peer_error(msg, "the emulation")
            self.error = self.error or why
        return self.error

    def settle(self, seconds: float) -> str | None:
        """This host's run failed: wait up to `seconds` for word that another host's end caused it (a rank
        whose gloo peer on a dead host went away fails as soon as the bridge hears of it)."""
        deadline = time.monotonic() + seconds
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.error

    def others_done(self) -> bool:
        """Every other host said bye: its sandbox ranks finished."""
        return len(self.bridge.finished) == self.view.nnodes - 1 and self.error is None

    def close(self, reason: str | None) -> None:
        """Say bye (or why this host failed) to every other host and wait for theirs."""
        self.bridge.close(reason)
