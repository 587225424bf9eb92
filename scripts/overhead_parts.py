"""Which part of PrismTrace costs what, measured as `prism bench overhead --interleave` measures it: one process, the
reference workload (W=1, CPU, `--microbatches 4`), PrismTrace on and off every other step, each on step against the
mean of the off steps either side (`overhead_stats.interleaved`), with a part of PrismTrace taken away in the on steps:

    python scripts/overhead_parts.py VARIANT [STEPS]        (pin it: taskset -c N ...; STEPS default 201)

VARIANT: full (what real mode records); no-mem (the memory read of each marker answers -1); no-bwd (no backward
hook on a microbatch's output: no bwd_begin/bwd_end); hooks-only (no-bwd, and every marker a no-op: the module and
optimizer hooks' own work); markers-at-start (no hooks: 17 markers, a step's count, at the step's start).
LIFT=0 in the environment turns off the outermost forward's lifting of the global module hooks (`markers.LIFT`).
Runs in this process with the interception installed by hand (`interception.install("real", ...)`, a one-rank gloo
group on a TCP store), not through the launcher; prints the pairs' median, its interval and the cost in us a step.
"""

import contextlib
import io
import os
import socket
import statistics
import sys
import tempfile
import time


def main(argv: list[str]) -> None:
    variant = argv[0]
    steps = int(argv[1]) if len(argv) > 1 else 201
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch  # noqa: F401

    from prism.bench import overhead_stats as stats
    from prism.runtime import interception, markers
    from prism.runtime import memory as memory_probe
    from prism.runtime import recorder as recorder_module
    from prism.workloads import moe_gpt

    markers.LIFT = os.environ.get("LIFT", "1") == "1"
    if variant == "no-mem":
        memory_probe.MemoryProbe.sample = lambda self: (-1, -1, -1)
    elif variant in ("no-bwd", "hooks-only"):
        markers._first_grad_tensor = lambda output: None
        if variant == "hooks-only":
            recorder_module.Recorder.marker = lambda self, op: None
    elif variant not in ("full", "markers-at-start"):
        raise SystemExit(f"unknown variant {variant!r}: full, no-mem, no-bwd, hooks-only, markers-at-start")
    interception.install("real", tempfile.mkdtemp(prefix="prism-parts-"))
    durations, states, at = [], [], {}

    def between(step: int) -> None:
        now = time.perf_counter()
        if step > 1:
            durations.append((now - at["start"]) * 1e3)
            states.append(at["on"])
        if step > steps:
            return
        on = step % 2 == 0
        hooked = on and variant != "markers-at-start"
        (interception.resume if hooked else interception.suspend)()
        at.update(on=on, start=time.perf_counter())
        if on and variant == "markers-at-start":
            rec = interception.recorder()
            for _ in range(17):
                rec.marker("fwd_begin")

    with contextlib.redirect_stdout(io.StringIO()):
        moe_gpt.main(["--steps", str(steps), "--microbatches", "4"], between_steps=between)
    res = stats.interleaved(durations, states, warm=4)
    lo, hi, cover = res.ci()
    off = statistics.median(res.off_steps)
    print(f"{variant:<16} LIFT={int(markers.LIFT)} pairs {len(res.ratios)} median {100 * res.overhead:+.2f} % "
          f"[{100 * lo:+.2f}, {100 * hi:+.2f}] ({100 * cover:.1f} %); off median {off:.2f} ms -> "
          f"{res.overhead * off * 1e3:+.0f} us a step; level changed in {sum(res.changed)} pairs")


if __name__ == "__main__":
    main(sys.argv[1:])
