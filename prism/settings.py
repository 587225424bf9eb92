"""Every `PRISM_*` environment variable prism reads, in one typed table: name, type, default, meaning.

The code reads a variable through its `Setting` here (`settings.DEVICE.get()`), never `os.environ` by a
name of its own. Three kinds:
- "knob": a user (or a config, a script) sets it to change what prism does;
- "internal": the launcher sets it for the processes it starts (and clears it from the environment it was
  given, `launcher_clears`), so a stale value from an outer run never leaks in;
- "test": read by the test suite and the device scripts only.

A neutral module (it imports nothing of prism): the runtime and the analysis side both read it.
`python -m prism.settings` prints the table of docs/settings.md (a test keeps that file up to date).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Setting:
    name: str
    type: str  # "text", "path", "int", "float", "flag" (on unless "0"), "ranks" (comma-separated ints)
    default: object
    kind: str  # "knob", "internal" or "test"
    meaning: str

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text as set (None when unset)."""
        return (os.environ if env is None else env).get(self.name)

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """Set to a non-empty value."""
        return bool(self.raw(env))

    def get(self, env: Mapping[str, str] | None = None):
        """The value, typed; the default when unset or empty. A value that does not parse raises ValueError
        naming the variable and what it takes."""
        text = self.raw(env)
        if text is None or (text == "" and self.type != "text"):
            return self.default
        try:
            if self.type == "flag":
                return text != "0"
            if self.type == "int":
                return int(text)
            if self.type == "float":
                return float(text)
            if self.type == "ranks":
                return [int(r) for r in text.split(",") if r.strip()]
        except ValueError:
            raise ValueError(f"{self.name}={text!r} is not {_TAKES[self.type]}: {self.meaning}") from None
        return text  # text, path


_TAKES = {"int": "an integer", "float": "a number", "ranks": "a comma-separated list of ranks"}

SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # knobs
    Setting("PRISM_DEVICE", "text", "cpu", "knob",
            "where the ranks' tensors live: cpu or cuda (the job config's `device` sets it for the stages)"),
    Setting("PRISM_JOB", "path", None, "knob", "the job folder `prism sql` reads when --job is not given"),
    Setting("PRISM_HANG_TIMEOUT", "float", None, "knob",
            "modes real, slice, emulate: seconds every rank run for real may be stuck before the watchdog names "
            "the hang (0: off; "
            "default 60; `prism launch --hang-timeout` sets it)"),
    Setting("PRISM_LOCK_WAIT", "float", 600.0, "knob",
            "seconds a command that writes into a job folder waits for another prism command holding it "
            "(`prism.folder_lock`; 0: refused at once)"),
    Setting("PRISM_STALL_TIMEOUT", "float", 300.0, "knob",
            "capture, slice, emulate: seconds a run's processes may use no CPU and write no note before the "
            "launcher prints what each waits in (Python stacks too); after twice as long it stops the run (exit "
            "86; 0: off)"),
    Setting("PRISM_RANK_OUTPUT", "text", None, "knob",
            "capture: `files` or `pipes` forces how the ranks' output reaches the launcher (default: pipes "
            "while the open-file limit allows them)"),
    Setting("PRISM_FORK_BATCH", "int", None, "knob",
            "the ranks a fork helper forks (0: the zygote forks every rank itself; default 64)"),
    Setting("PRISM_IMMORTAL", "flag", True, "knob",
            "capture: 0 leaves the zygote's objects mortal before the fork (for comparisons)"),
    Setting("PRISM_HEAP_HOLES", "flag", True, "knob",
            "capture: 0 leaves the zygote's free C-heap chunks to the ranks before the fork (for comparisons)"),
    Setting("PRISM_FAST_NONMEMBER", "flag", True, "knob",
            "capture: 0 turns off the short path for a rank outside a new group (torch's per-call work instead)"),
    Setting("PRISM_MEMORY_PROFILE", "path", None, "knob",
            "capture: a folder where each rank writes its private bytes by mapping kind (scripts/rank_memory.py)"),
    Setting("PRISM_CUDA_BUILD_DIR", "path", None, "knob",
            "emulate on CUDA: where the fold kernel is built (default torch's ~/.cache/torch_extensions)"),
    Setting("PRISM_CUDA_VERBOSE", "flag", False, "knob", "emulate on CUDA: a verbose build of the fold kernel"),
    Setting("PRISM_ITERATION_FN", "text", None, "knob",
            "MODULE:QUALNAME whose outermost call is one iteration (`prism launch --iteration-fn`, the job "
            "config's workload.iteration_fn set it; default: the outermost optimizer step)"),
    Setting("PRISM_MICROBATCH_FN", "text", None, "knob",
            "MODULE:QUALNAME whose outermost call is one microbatch (`prism launch --microbatch-fn`, "
            "workload.microbatch_fn; default: the forward of a module with trainable parameters)"),
    Setting("PRISM_RDZV_TIMEOUT", "float", 120.0, "knob",
            "a capture over hosts: seconds a launcher waits for the other hosts (rendezvous, the job's end)"),
    Setting("PRISM_HOST_HANG_S", "float", 60.0, "knob",
            "a capture over hosts: seconds a host's ranks may all wait with no frame from another host "
            "before the hang is named"),
    Setting("PRISM_MASTER_PORT", "int", 29500, "knob",
            "scripts/slurm_launch.sh: the port host 0 (the allocation's first node) serves the rendezvous on"),
    Setting("PRISM_PYTHON", "path", "python3", "knob",
            "scripts/slurm_launch.sh: the python whose prism each node's launcher runs"),
    Setting("PRISM_SLICE_PRELOAD_MB", "float", 1024.0, "knob",
            "slice: MB of captured reduction results (groups of > 2 members) a slice rank loads and checks "
            "before the program runs; those past it are loaded during the run on the rank's own core, which its "
            "timed compute then includes (a warning says so); 0: all during the run"),
    Setting("PRISM_SLICE_RING", "text", "neighbours", "knob",
            "slice: how the replay server plays the virtual members of a group whose collectives are all "
            "all-reduces (>= 3 members, CPU): `neighbours` (the slice ranks run the N-ring's steps, the server "
            "plays only their ring neighbours: `prism.runtime.slice.ring`) or `members` (one gloo instance a "
            "virtual member)"),
    Setting("PRISM_ZYGOTE_TEMPLATE", "path", None, "knob",
            "the socket of a warm zygote template (`prism.runtime.launch.zygote_template`, started by `prism bench "
            "fidelity`): a launch forks its zygote from it instead of starting a new interpreter, where it fits"),
    # set by the launcher for its ranks
    Setting("PRISM_MODE", "text", None, "internal",
            "the launch mode of the ranks (`prism launch --mode`); unset: prism installs nothing"),
    Setting("PRISM_OUT", "path", None, "internal", "the folder where a rank writes its trace (the run's staging)"),
    Setting("PRISM_STATUS_DIR", "path", None, "internal",
            "the run's status folder (its spec, the ranks' notes, tracebacks)"),
    Setting("PRISM_PROGRESS_DIR", "path", None, "internal",
            "where a rank notes the iterations it ended (the launcher's progress display)"),
    Setting("PRISM_RANK_MEMORY_BYTES", "int", None, "internal",
            "each rank's CUDA caching-allocator limit in bytes (`prism launch --rank-memory-gb`)"),
    Setting("PRISM_SHM_DIR", "path", None, "internal", "capture: the run's shared-memory folder"),
    Setting("PRISM_PAYLOADS", "path", None, "internal", "capture: where the ranks' payloads are staged"),
    Setting("PRISM_CORES", "ranks", None, "internal", "capture: the cores of the device slots"),
    Setting("PRISM_CTL_FD", "int", None, "internal", "capture: a rank's control socket to the coordinator"),
    Setting("PRISM_CAPTURE", "path", None, "internal", "slice / emulate: the capture folder replayed"),
    Setting("PRISM_SLICE_RANKS", "ranks", [], "internal", "slice / emulate: the ranks run for real"),
    Setting("PRISM_CLOCK_OFFSET_NS", "int", 0, "internal",
            "emulate over hosts: this host's monotonic clock minus host 0's, in ns (the launchers' clock exchange, "
            "`launch.hosts.sync_clocks`)"),
    Setting("PRISM_PRUNING", "flag", True, "internal",
            "emulate: 0 makes every virtual member its own participant (`--no-pruning`)"),
    # the test suite's and the device scripts'
    Setting("PRISM_GPU_TABLES", "path", None, "test", "GPU tests: the folder their measured tables are written to"),
    Setting("PRISM_REQUIRE_SLURM", "text", None, "test", "1: the SLURM workflow test fails instead of skipping"),
    Setting("PRISM_REQUIRE_BROWSER", "text", None, "test", "1: the report's browser test fails instead of skipping"),
    Setting("PRISM_TEST_INDUCTOR", "text", None, "test",
            "set (non-empty): also run the torch.compile (inductor) capture test"),
    Setting("PRISM_COST_PROBE", "path", None, "test",
            "scripts/fidelity_fixed_cost.py: the file its timing probe (scripts/fixed_cost_probe) appends marks to"),
    Setting("PRISM_COST_PROBE_TEMPLATE", "text", None, "test",
            "scripts/fidelity_fixed_cost.py: set in a zygote template's environment, so that its timing probe "
            "hooks the template's forks"),
)}


def _setting(name: str) -> Setting:
    return SETTINGS[name]


DEVICE = _setting("PRISM_DEVICE")
JOB = _setting("PRISM_JOB")
HANG_TIMEOUT = _setting("PRISM_HANG_TIMEOUT")
LOCK_WAIT = _setting("PRISM_LOCK_WAIT")
STALL_TIMEOUT = _setting("PRISM_STALL_TIMEOUT")
RANK_OUTPUT = _setting("PRISM_RANK_OUTPUT")
FORK_BATCH = _setting("PRISM_FORK_BATCH")
IMMORTAL = _setting("PRISM_IMMORTAL")
FAST_NONMEMBER = _setting("PRISM_FAST_NONMEMBER")
HEAP_HOLES = _setting("PRISM_HEAP_HOLES")
MEMORY_PROFILE = _setting("PRISM_MEMORY_PROFILE")
CUDA_BUILD_DIR = _setting("PRISM_CUDA_BUILD_DIR")
CUDA_VERBOSE = _setting("PRISM_CUDA_VERBOSE")
ITERATION_FN = _setting("PRISM_ITERATION_FN")
MICROBATCH_FN = _setting("PRISM_MICROBATCH_FN")
RDZV_TIMEOUT = _setting("PRISM_RDZV_TIMEOUT")
HOST_HANG_S = _setting("PRISM_HOST_HANG_S")
SLICE_PRELOAD_MB = _setting("PRISM_SLICE_PRELOAD_MB")
SLICE_RING = _setting("PRISM_SLICE_RING")
ZYGOTE_TEMPLATE = _setting("PRISM_ZYGOTE_TEMPLATE")
MODE = _setting("PRISM_MODE")
OUT = _setting("PRISM_OUT")
STATUS_DIR = _setting("PRISM_STATUS_DIR")
PROGRESS_DIR = _setting("PRISM_PROGRESS_DIR")
RANK_MEMORY_BYTES = _setting("PRISM_RANK_MEMORY_BYTES")
SHM_DIR = _setting("PRISM_SHM_DIR")
PAYLOADS = _setting("PRISM_PAYLOADS")
CORES = _setting("PRISM_CORES")
CTL_FD = _setting("PRISM_CTL_FD")
CAPTURE = _setting("PRISM_CAPTURE")
SLICE_RANKS = _setting("PRISM_SLICE_RANKS")
PRUNING = _setting("PRISM_PRUNING")
CLOCK_OFFSET_NS = _setting("PRISM_CLOCK_OFFSET_NS")


def launcher_clears() -> list[str]:
    """The variables the launcher removes from the environment it hands its ranks before it sets its own."""
    return [s.name for s in SETTINGS.values() if s.kind == "internal"]


def table() -> str:
    """docs/settings.md: the table of every variable."""
    lines = ["# prism's environment variables", "",
             "Generated from `prism/settings.py` by `python -m prism.settings > docs/settings.md` (a test keeps",
             "it up to date). Knobs are yours to set; internal ones the launcher sets for the processes it starts",
             "(and clears from the environment it was given); test ones the test suite and the device scripts read.",
             "", "| variable | kind | type | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        default = "" if s.default in (None, []) else f"`{s.default}`" if s.type != "flag" else f"`{int(s.default)}`"
        lines.append(f"| `{s.name}` | {s.kind} | {s.type} | {default} | {s.meaning.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
