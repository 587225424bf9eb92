"""One rank of `prism bench overhead --interleave`: the reference workload, PrismTrace on and off by turns.

    prism launch --mode real --out DIR ... prism/bench/interleave_rank.py --times DIR --block B [WORKLOAD ARGS...]

Run by `prism launch --mode real`, so the rank has exactly what real mode installs (the interception, the
recorder, the markers' global hooks). Between two steps (`moe_gpt.main`'s `between_steps`, outside any step)
it switches PrismTrace off (`interception.suspend`: the hooks removed from torch's hook dicts, the groups'
recorder detached) or back on (`interception.resume`), in blocks of B steps, off first: step k is on when
`(k - 1) // B` is odd. For every step it writes to DIR/rank<R>.json its start and end (perf_counter ns, the
switch done before the start), whether PrismTrace was on, the events the recorder recorded in it and the
size of torch's four global hook dicts at its start; DIR/rank<R>.cores.json: the rank's affinity.
"""

import json
import os
import sys
import time


def is_on(step: int, block: int) -> bool:
    """PrismTrace's state in step `step` (from 1): blocks of `block` steps, off first."""
    return ((step - 1) // block) % 2 == 1


def global_hooks() -> int:
    """How many hooks torch's global module-forward and optimizer-step dicts hold."""
    from torch.nn.modules import module
    from torch.optim import optimizer

    return (len(module._global_forward_pre_hooks) + len(module._global_forward_hooks)
            + len(optimizer._global_optimizer_pre_hooks) + len(optimizer._global_optimizer_post_hooks))


def main(argv: list[str]) -> None:
    times_dir, block = None, 1
    while argv and argv[0] in ("--times", "--block"):
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--times":
            times_dir = value
        else:
            block = int(value)
    from prism.runtime import interception
    from prism.workloads import moe_gpt

    steps = moe_gpt.parse_args(argv).steps
    rows = {"start": [], "end": [], "on": [], "events": [], "hooks": []}
    begun = [0]  # the recorder's event count at the step's start

    def events() -> int:
        rec = interception.recorder()
        return rec.recorded if rec is not None else 0

    def between(step: int) -> None:
        now = time.perf_counter_ns()
        if step > 1:  # the step before ends here
            rows["end"].append(now)
            rows["events"].append(events() - begun[0])
        if step <= steps:
            on = is_on(step, block)
            (interception.resume if on else interception.suspend)()
            rows["on"].append(on)
            rows["hooks"].append(global_hooks())
            begun[0] = events()
            rows["start"].append(time.perf_counter_ns())

    moe_gpt.main(argv, between_steps=between)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(times_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    with open(os.path.join(times_dir, f"rank{rank}.cores.json"), "w") as f:
        json.dump(sorted(os.sched_getaffinity(0)), f)


if __name__ == "__main__":
    main(sys.argv[1:])
