"""One rank of `prism bench overhead --interleave`: the reference workload, PrismTrace on and off by turns.

    prism launch --mode real --out DIR ... prism/bench/interleave_rank.py --times DIR --block B [--ablate A,B]
        [WORKLOAD ARGS...]

Run by `prism launch --mode real`, so the rank has exactly what real mode installs (the interception, the
recorder, the markers' global hooks). Between two steps (`moe_gpt.main`'s `between_steps`, outside any step)
it switches PrismTrace off (`interception.suspend`: the hooks removed from torch's hook dicts, the groups'
recorder detached) or back on (`interception.resume`), in blocks of B steps, off first: step k is on when
`(k - 1) // B` is odd. For every step it writes to DIR/rank<R>.json its start and end (perf_counter ns, the
switch done before the start), whether PrismTrace was on, the events the recorder recorded in it and the
size of torch's four global hook dicts at its start; DIR/rank<R>.cores.json: the rank's affinity.

`--ablate` (a diagnostic of where PrismTrace's cost goes, not the product's number): the on blocks take turns
between full PrismTrace and PrismTrace with one part taken away (`ABLATIONS`), each its own state in the same run,
every such block between two off blocks: off, on, off, -A, off, -B, off, on, ... A step's state is written as
false (off), true (on) or the ablation's name; "A+B" takes both parts away in one state.
"""

import gc
import json
import os
import sys
import time


def is_on(step: int, block: int) -> bool:
    """PrismTrace's state in step `step` (from 1): blocks of `block` steps, off first."""
    return ((step - 1) // block) % 2 == 1


def state(step: int, block: int, ablate: list[str] = ()) -> bool | str:
    """Step `step`'s state: False (off), True (on) or the name of the ablation its on block runs (the on blocks
    cycle through True and `ablate`'s names, in order)."""
    if not is_on(step, block):
        return False
    states = [True, *ablate]
    return states[((step - 1) // block // 2) % len(states)]


class _Part:
    """One part of PrismTrace that an ablated on step runs without: `apply(rec)` takes it away (after
    `interception.resume`), `undo(rec)` puts it back (before the next switch)."""

    def __init__(self, what: str, apply, undo) -> None:
        self.what, self.apply, self.undo = what, apply, undo


def _no_memory(rec) -> None:
    rec.memory.sample = lambda: (-1, -1, -1)  # (an instance attribute: the class's method is back once deleted)


def _memory_back(rec) -> None:
    rec.memory.__dict__.pop("sample", None)


def _no_events(rec) -> None:
    rec._saved_clock, rec._clock = rec._clock, None


def _events_back(rec) -> None:
    if "_saved_clock" in rec.__dict__:
        rec._clock = rec.__dict__.pop("_saved_clock")


def _no_markers(rec) -> None:
    rec.marker = lambda op: None


def _markers_back(rec) -> None:
    rec.__dict__.pop("marker", None)


def _no_bwd(rec) -> None:
    from prism.runtime import markers

    markers.__dict__.setdefault("_saved_first_grad", markers._first_grad_tensor)
    markers._first_grad_tensor = lambda output: None


def _bwd_back(rec) -> None:
    from prism.runtime import markers

    if "_saved_first_grad" in markers.__dict__:
        markers._first_grad_tensor = markers.__dict__.pop("_saved_first_grad")


def _no_cpu_clock(rec) -> None:
    from prism.runtime import recorder

    recorder.__dict__.setdefault("_saved_cpu", recorder._cpu)
    recorder._cpu = lambda: 0
    rec.resync()


def _cpu_clock_back(rec) -> None:
    from prism.runtime import recorder

    if "_saved_cpu" in recorder.__dict__:
        recorder._cpu = recorder.__dict__.pop("_saved_cpu")
        rec.resync()


def _uncut(rec) -> None:
    """The recorder as before session 17's cuts: a marker by `begin` + `end`, CUDA events through `torch.cuda.Event`'s
    wrappers (`record()` on `torch.cuda.current_stream()`), each pending span's end queried in turn at an iteration
    end, the allocator through `torch.cuda.memory_stats_as_nested_dict()` (same trace, the old path's cost)."""
    from prism.runtime.recorder import Recorder

    rec.marker = Recorder._marker_by_calls.__get__(rec)
    clock = rec._clock
    if clock is not None:
        clock._saved_api = clock._record, clock._query, clock._elapsed
        clock._record, clock._query = (lambda ev: ev.record()), (lambda ev: ev.query())
        clock._elapsed = lambda start, end: start.elapsed_time(end)

        def in_turn() -> int:
            done = 0
            for _, _, end in clock._pending:
                if not end.query():
                    break
                done += 1
            return done

        clock._completed = in_turn
    if rec.memory.cuda:
        import torch

        rec.memory._saved_stats, rec.memory._allocator_stats = rec.memory._allocator_stats, \
            torch.cuda.memory_stats_as_nested_dict


def _cuts_back(rec) -> None:
    rec.__dict__.pop("marker", None)
    clock = rec._clock
    if clock is not None and "_saved_api" in clock.__dict__:
        clock._record, clock._query, clock._elapsed = clock.__dict__.pop("_saved_api")
        clock.__dict__.pop("_completed", None)
    if "_saved_stats" in rec.memory.__dict__:
        rec.memory._allocator_stats = rec.memory.__dict__.pop("_saved_stats")


ABLATIONS = {
    "memory": _Part("the markers' memory read answers -1 (CUDA: the allocator's statistics; CPU: RSS)",
                    _no_memory, _memory_back),
    "events": _Part("no CUDA event at the event boundaries (device_ns is the CPU time; CPU: nothing changes)",
                    _no_events, _events_back),
    "markers": _Part("every marker a no-op: the module, optimizer and backward hooks' own work", _no_markers,
                     _markers_back),
    "bwd": _Part("no hook on a microbatch's output: no bwd_begin/bwd_end markers (8 of 17 a step)", _no_bwd,
                 _bwd_back),
    "uncut": _Part("not an ablation: the recorder without session 17's cuts (the same trace, the old code path)",
                   _uncut, _cuts_back),
    "cpuclock": _Part("the recorder's CPU clock (thread_time_ns) reads 0", _no_cpu_clock, _cpu_clock_back),
}


def global_hooks() -> int:
    """How many hooks torch's global module-forward and optimizer-step dicts hold."""
    from torch.nn.modules import module
    from torch.optim import optimizer

    return (len(module._global_forward_pre_hooks) + len(module._global_forward_hooks)
            + len(optimizer._global_optimizer_pre_hooks) + len(optimizer._global_optimizer_post_hooks))


def main(argv: list[str]) -> None:
    times_dir, block, ablate = None, 1, []
    while argv and argv[0] in ("--times", "--block", "--ablate"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--times":
            times_dir = value
        elif flag == "--ablate":
            ablate = [a for a in value.split(",") if a]
            unknown = [p for a in ablate for p in a.split("+") if p not in ABLATIONS]
            if unknown:
                raise SystemExit(f"--ablate {','.join(unknown)}: not one of {', '.join(ABLATIONS)}")
        else:
            block = int(value)
    from prism.runtime import interception
    from prism.workloads import moe_gpt

    steps = moe_gpt.parse_args(argv).steps
    rows = {"start": [], "end": [], "on": [], "events": [], "hooks": [], "gc": [], "gc_us": []}
    collected = {"n": 0, "ns": 0, "t0": 0}  # the garbage collections inside the step (gc.callbacks)

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collected["t0"] = time.perf_counter_ns()
        else:
            collected["n"] += 1
            collected["ns"] += time.perf_counter_ns() - collected["t0"]

    gc.callbacks.append(on_gc)
    begun = [0]  # the recorder's event count at the step's start
    applied = []  # the ablation in force

    def events() -> int:
        rec = interception.recorder()
        return rec.recorded if rec is not None else 0

    def between(step: int) -> None:
        now = time.perf_counter_ns()
        if step > 1:  # the step before ends here
            rows["end"].append(now)
            rows["events"].append(events() - begun[0])
            rows["gc"].append(collected["n"])
            rows["gc_us"].append(collected["ns"] / 1e3)
        if applied:
            for part in reversed(applied.pop().split("+")):
                ABLATIONS[part].undo(interception.recorder())
        if step <= steps:
            on = state(step, block, ablate)
            (interception.resume if on is not False else interception.suspend)()
            if isinstance(on, str):  # an ablation, or several joined by "+"
                for part in on.split("+"):
                    ABLATIONS[part].apply(interception.recorder())
                applied.append(on)
            rows["on"].append(on)
            rows["hooks"].append(global_hooks())
            begun[0] = events()
            collected.update(n=0, ns=0)
            rows["start"].append(time.perf_counter_ns())

    moe_gpt.main(argv, between_steps=between)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(times_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    with open(os.path.join(times_dir, f"rank{rank}.cores.json"), "w") as f:
        json.dump(sorted(os.sched_getaffinity(0)), f)


if __name__ == "__main__":
    main(sys.argv[1:])
