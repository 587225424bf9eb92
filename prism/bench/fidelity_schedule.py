"""The order of a fidelity config's runs (truth and prism runs) and the prism runs' variants (`prism bench fidelity
--alternate`, `--slice-load`, `--plan-keep`, `--plan-rule`)."""

from __future__ import annotations


def variant_label(slice_load: str, keep_whole: str, plan_rule: str = "") -> str:
    """A prism run's variant: "none" (the pipeline's defaults), else its options joined by "+"."""
    parts = (([slice_load] if slice_load != "none" else []) + ([f"keep={keep_whole}"] if keep_whole else [])
             + ([f"rule={plan_rule}"] if plan_rule else []))
    return "+".join(parts) or "none"


def variant_options(label: str) -> tuple[str, str, str]:
    """(slice_load, keep_whole, plan_rule) of a `variant_label` ("" for the plan's defaults)."""
    load, keep, rule = "none", "", ""
    for part in label.split("+"):
        if part.startswith("keep="):
            keep = part[5:]
        elif part.startswith("rule="):
            rule = part[5:]
        elif part != "none":
            load = part
    return load, keep, rule


def prism_schedule(repeats: int, prism_runs: int, variant: str, alternate: bool = False) -> list[tuple[str, int, str]]:
    """The runs of a config in order: ("truth", i, "none") and ("prism", j, variant). Default: prism run j after
    truth run j, every one the `variant` (`variant_label`). `alternate`: between every two truth runs one prism
    run of the defaults ("none") and one of `variant`, their order swapped from one gap to the next,
    `prism_runs` ignored (2 x (repeats - 1) prism runs)."""
    runs: list[tuple[str, int, str]] = []
    if alternate:
        for i in range(repeats):
            runs.append(("truth", i, "none"))
            if i < repeats - 1:
                pair = ["none", variant] if i % 2 == 0 else [variant, "none"]
                runs += [("prism", 2 * i, pair[0]), ("prism", 2 * i + 1, pair[1])]
        return runs
    for i in range(max(repeats, prism_runs)):
        if i < repeats:
            runs.append(("truth", i, "none"))
        if i < prism_runs:
            runs.append(("prism", i, variant))
    return runs
