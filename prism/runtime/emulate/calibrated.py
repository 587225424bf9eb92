"""Mode `emulate`, rank side: the calibrated model's numbers the worker publishes for the sandbox ranks' holds.

Before the common start the worker (`emulate.worker.serve`) sets, on the job's store, every real collective's
calibrated transfer (`TimedReplay.collective_transfers`) and each sandbox rank's calibrated own times of its waits
on them (`TimedReplay.wait_owns`); a sandbox rank reads each once (`transfers`, `wait_owns`). Their presence says
the emulation is timed (`timed`). Used by `emulate.transport` (the transfer hold, `EmuWork`'s own time).
"""

from __future__ import annotations

import json
import os

from prism.runtime.transport import job_store

TRANSFERS_KEY = "prism-emu/transfers"  # the worker's `TimedReplay.collective_transfers`, as JSON
OWNS_KEY = "prism-emu/wait-owns"  # the worker's `TimedReplay.wait_owns`, as JSON
_TRANSFERS: dict[str, int] | None = None
_OWNS: dict[str, int] | None = None
_TIMED = False


def wait_owns(store) -> dict[str, int]:
    """This rank's calibrated own times of its waits on the real collectives (ns by "<group>/<seq>"; the
    worker's `TimedReplay.wait_owns`), read once; empty in an uncalibrated job."""
    global _OWNS
    if _OWNS is None:
        base = job_store(store)
        owns = json.loads(base.get(OWNS_KEY)) if base.check([OWNS_KEY]) else {}
        _OWNS = owns.get(os.environ.get("RANK", "0"), {})
    return _OWNS


def transfers(store) -> dict[str, int]:
    """The calibrated transfers of the real collectives (ns by "<group>/<seq>"), read once from the job's
    store after the common start; empty when the worker published none (an uncalibrated job)."""
    global _TRANSFERS, _TIMED
    if _TRANSFERS is None:
        base = job_store(store)
        _TIMED = bool(base.check([TRANSFERS_KEY]))
        _TRANSFERS = json.loads(base.get(TRANSFERS_KEY)) if _TIMED else {}
    return _TRANSFERS


def timed(store) -> bool:
    """Whether the worker runs the timed replay (it published the transfers): then it sends each real
    collective's virtual floor (`transport.floor_sender`)."""
    transfers(store)
    return _TIMED
