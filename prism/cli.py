"""The `prism` command: one subcommand per thing a user does; each delegates to its stage's `main`."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "launch": ("prism.runtime.launcher", "run a program's W ranks (torchrun-compatible) with PrismTrace"),
    "graph": ("prism.graph", "build the graph tables of a job from its raw trace"),
    "sql": ("prism.sql", "DuckDB SQL over a job's artifacts"),
    "calibrate": ("prism.calibrate.stage", "one global clock for a job's graph (calibrated timeline)"),
    "baseline": ("prism.baseline", "the real run of a job config, its graph and summary"),
    "bench": ("prism.bench", "benchmarks that print tables (overhead, ...)"),
    "profiles": ("prism.profiles", "install prism's Snakemake profiles where `snakemake --profile` finds them"),
}


def usage() -> str:
    lines = ["usage: prism COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "prism COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"prism: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
