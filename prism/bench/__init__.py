"""`prism bench NAME`: benchmarks that print tables (ratios against a baseline measured in the same run)."""

from __future__ import annotations

import importlib
import sys

BENCHES = {  # prism bench NAME: (module with main(argv), one line of help)
    "overhead": ("prism.bench.overhead", "PrismTrace's and torch.profiler's overhead on the workload (W=2)"),
    "capture": ("prism.bench.capture_scale", "capture (and --pipeline: graph, plan, calibrate) at each W on P=2"),
    "calibrate": ("prism.bench.calibrate", "the global-clock sweep on synthetic graphs up to 8192 ranks"),
    "fidelity": ("prism.bench.fidelity", "predicted against real iteration times over a layout matrix"),
    "emulate": ("prism.bench.emulate", "capture, calibrate and emulate one sandbox rank at each W"),
    "pruning": ("prism.bench.pruning", "emulations with pruning on and off: communicators, bytes moved, wall time"),
    "emulate-ops": ("prism.bench.emulate_ops", "one collective through the emulated sandbox's transport vs gloo"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        from prism.cli import subcommand_usage

        asked = bool(argv) and argv[0] in ("-h", "--help")
        print(subcommand_usage("bench", BENCHES), file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    return importlib.import_module(BENCHES[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
