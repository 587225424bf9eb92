"""The launch modes in one place: what each one starts and needs.

The launcher (options, environment), the zygote (which processes it forks), the interception (which
transport and recorder a rank gets) and `sitecustomize` (whether anything is installed) read a mode's
record here instead of comparing mode strings of their own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    intercepted: bool  # prism's backend is installed in the ranks (PRISM_MODE set)
    transport: str  # "real", "capture", "slice", "emulate" (interception picks the class)
    recorder: str  # "plain": records the trace; "checked": also stops at the first op unlike the capture
    coordinator: bool  # the zygote runs the capture coordinator (every rank on --devices slots)
    replay: bool  # the zygote forks one replay process that stands in for the ranks not run for real
    store_in_supervisor: bool  # the job's store is hosted by the zygote (not every rank exists)
    needs_capture: bool  # --capture CAPDIR (a finished capture with payloads)
    ranks_option: str | None  # the option naming the ranks run for real (None: all W ranks run)


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("off", intercepted=False, transport="real", recorder="plain", coordinator=False, replay=False,
         store_in_supervisor=False, needs_capture=False, ranks_option=None),
    Mode("real", intercepted=True, transport="real", recorder="plain", coordinator=False, replay=False,
         store_in_supervisor=False, needs_capture=False, ranks_option=None),
    Mode("capture", intercepted=True, transport="capture", recorder="plain", coordinator=True, replay=False,
         store_in_supervisor=True, needs_capture=False, ranks_option=None),
    Mode("slice", intercepted=True, transport="slice", recorder="checked", coordinator=False, replay=True,
         store_in_supervisor=True, needs_capture=True, ranks_option="--slice-ranks"),
    Mode("emulate", intercepted=True, transport="emulate", recorder="checked", coordinator=False, replay=True,
         store_in_supervisor=True, needs_capture=True, ranks_option="--sandbox"),
)}


def get(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"PRISM_MODE={name!r} is not a mode of this prism (modes: {', '.join(MODES)})") from None


def partial(name: str) -> bool:
    """Whether only some of the W ranks run for real (the others are replayed)."""
    return get(name).ranks_option is not None
