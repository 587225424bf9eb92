"""`prism bench NAME`: benchmarks that print tables (ratios against a baseline measured in the same run)."""

from __future__ import annotations

import importlib
import sys

BENCHES = {
    "overhead": "prism.bench.overhead",
    "capture": "prism.bench.capture_scale",
    "calibrate": "prism.bench.calibrate",
    "fidelity": "prism.bench.fidelity",
    "emulate": "prism.bench.emulate",
    "pruning": "prism.bench.pruning",
    "emulate-ops": "prism.bench.emulate_ops",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(f"usage: prism bench {{{','.join(BENCHES)}}} [OPTIONS]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return importlib.import_module(BENCHES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
