"""The launch modes in one place: what each one starts and needs, and the parts that carry it out.

The launcher (options, environment), the zygote (which processes it forks), the interception (which
transport and recorder a rank gets) and `sitecustomize` (whether anything is installed) read a mode's
record here instead of comparing mode strings of their own. A mode's parts are named by where they live
("module:function"), imported only when used: a capture run never imports the emulate mode's modules.

Adding a mode: one record below, its transport factory (`for_group(opts, name, members, desc, asked, rec)`:
the transport of one process group of a rank) and, when some ranks are replayed, its replay process
(`serve(spec)`: one process that stands in for the ranks not run for real, given the `ZygoteSpec`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    intercepted: bool  # prism's backend is installed in the ranks (PRISM_MODE set)
    transport: str  # "module:function": the factory of a group's transport (`make_transport`)
    recorder: str  # "plain": records the trace; "checked": also stops at the first op unlike the capture
    coordinator: bool  # capture: the zygote runs the capture coordinator (every rank on --devices slots,
    #                    the data through shared memory)
    replay_role: str | None  # "module:function": the replay process the zygote forks (`serve_replay`);
    #                          it stands in for the ranks not run for real (None: every rank runs)
    replay_name: str | None  # how messages name that process
    store_in_supervisor: bool  # the job's store is hosted by the zygote (not every rank exists)
    needs_capture: bool  # --capture CAPDIR (a finished capture with payloads)
    ranks_option: str | None  # the option naming the ranks run for real (None: all W ranks run)
    sandbox: bool = False  # emulate: the real ranks are a sandbox on --devices slots inside the replayed
    #                        job (their output also in OUT/logs, their transports' numbers in meta.json)
    watchdog: bool = False  # real, slice, emulate: each rank run for real runs the hang watchdog (--hang-timeout;
    #                         emulate: the replay worker takes part)
    timed: bool = False  # slice: --timed-by times the replayed ranks on a calibrated timeline
    computes: bool = False  # capture, slice, emulate: prism computes the collectives' results, so only what its
    #                         semantics define is carried (no PREMUL_SUM, no sparse tensors: `unsupported`)
    stall_watch: bool = False  # the pipeline's runs (capture, slice, emulate): the launcher names a run whose
    #                            processes stopped moving, then stops it (`launch.stall`, PRISM_STALL_TIMEOUT)

    @property
    def replay(self) -> bool:
        """Whether the zygote forks a replay process (only some ranks run for real)."""
        return self.replay_role is not None

    @property
    def device_slots(self) -> bool:
        """Whether the ranks share --devices slots (capture: all W of them; emulate: the sandbox)."""
        return self.coordinator or self.sandbox

    def make_transport(self, opts, name: str, members: list[int], desc: str | None, asked: str, rec):
        """The transport of one process group of this rank (`opts`: torch's group options)."""
        return _part(self.transport)(opts, name, members, desc, asked, rec)

    def serve_replay(self, spec) -> int:
        """Run the replay process (in the zygote's forked child); returns its exit code."""
        return _part(self.replay_role)(spec)


def _part(where: str):
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("off", intercepted=False, transport="prism.runtime.transport:for_group", recorder="plain",
         coordinator=False, replay_role=None, replay_name=None, store_in_supervisor=False, needs_capture=False,
         ranks_option=None),
    Mode("real", intercepted=True, transport="prism.runtime.transport:for_group", recorder="plain",
         coordinator=False, replay_role=None, replay_name=None, store_in_supervisor=False, needs_capture=False,
         ranks_option=None, watchdog=True),
    Mode("capture", intercepted=True, transport="prism.runtime.capture.transport:for_group", recorder="plain",
         coordinator=True, replay_role=None, replay_name=None, store_in_supervisor=True, needs_capture=False,
         ranks_option=None, computes=True, stall_watch=True),
    Mode("slice", intercepted=True, transport="prism.runtime.slice.transport:for_group", recorder="checked",
         coordinator=False, replay_role="prism.runtime.slice.replay_server:serve_spec",
         replay_name="the replay server", store_in_supervisor=True, needs_capture=True,
         ranks_option="--slice-ranks", timed=True, watchdog=True, computes=True, stall_watch=True),
    Mode("emulate", intercepted=True, transport="prism.runtime.emulate.transport:for_group", recorder="checked",
         coordinator=False, replay_role="prism.runtime.emulate.worker:serve", replay_name="the replay worker",
         store_in_supervisor=True, needs_capture=True, ranks_option="--sandbox", sandbox=True, watchdog=True,
         computes=True, stall_watch=True),
)}


def get(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"PRISM_MODE={name!r} is not a mode of this prism (modes: {', '.join(MODES)})") from None


def of_run(meta: dict) -> Mode | None:
    """The mode a run's meta.json says it ran in (None: none of this prism's)."""
    return MODES.get(meta.get("mode"))


def captured(meta: dict) -> bool:
    """Whether a run's meta.json is a capture's (the input slice and emulate replay from)."""
    return of_run(meta) is MODES["capture"]


def partial(name: str) -> bool:
    """Whether only some of the W ranks run for real (the others are replayed)."""
    return get(name).ranks_option is not None
