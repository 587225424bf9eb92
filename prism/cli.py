"""The `prism` command: one subcommand per thing a user does; each delegates to its stage's `main`."""

from __future__ import annotations

import difflib
import importlib
import os
import subprocess
import sys
from pathlib import Path

from prism import __version__

# name: (module with main(argv), one line of help); in pipeline order, then the tools
STAGES = {
    "run": ("prism.cli", "run the whole pipeline of a job with Snakemake (prism run [--configfile JOB.yaml] ...)"),
    "baseline": ("prism.baseline", "the real run of a job config (ground truth): raw trace"),
    "capture": ("prism.capture", "capture the W ranks on P device slots (context switching): raw trace"),
    "graph": ("prism.graph", "build the graph tables of a job from its raw trace"),
    "slices": ("prism.cli", "plan the slices, run them for real, collect their durations (prism slices plan|run|durations)"),
    "calibrate": ("prism.calibrate.stage", "one global clock for a job's graph (calibrated timeline)"),
    "emulate": ("prism.emulate.stage", "run sandbox ranks for real inside the replayed job (emulation/)"),
    "summary": ("prism.summary", "the text summary of a job (summary.txt)"),
    "report": ("prism.report.stage", "the job's HTML report (report/report.html: plots, critical path)"),
}
TOOLS = {
    "export": ("prism.report.export", "a timeline as Perfetto/Chrome or Kineto (HTA) trace JSON"),
    "sql": ("prism.sql", "DuckDB SQL over a job's artifacts"),
    "launch": ("prism.runtime.launch.launcher", "run a program's W ranks (torchrun-compatible) with PrismTrace"),
    "bench": ("prism.bench", "benchmarks that print tables (overhead, ...)"),
    "profiles": ("prism.profiles", "install prism's Snakemake profiles where `snakemake --profile` finds them"),
}
COMMANDS = {**STAGES, **TOOLS}
SLICES = {  # prism slices NAME: (module with main(argv), one line of help)
    "plan": ("prism.slices.plan", "split the W ranks into slices of at most P ranks (slices/plan.parquet)"),
    "run": ("prism.slices.run", "run one slice (--slice K) or every measured one (--all) for real"),
    "durations": ("prism.calibrate.from_slices", "the durations and transfers the slices measured (calibrate's input)"),
}
REPO = Path(__file__).resolve().parents[1]


def usage() -> str:
    lines = ["usage: prism [--version] COMMAND [ARGS...]", "",
             "pipeline stages (each reads and writes artifacts under results/<job>/):"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in STAGES.items()]
    lines += ["", "tools:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in TOOLS.items()]
    lines += ["", "prism COMMAND --help shows a command's options."]
    return "\n".join(lines)


def run_pipeline(argv: list[str]) -> int:
    """`prism run [SNAKEMAKE ARGS]`: the job's pipeline on this machine (profiles/local), as `make demo` does."""
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: prism run [--configfile JOB.yaml] [SNAKEMAKE OPTIONS...]\n\n"
              "Runs workflow/Snakefile with --profile profiles/local (default job: config/config.yaml);\n"
              "other options go to Snakemake (e.g. -n for a dry run, --profile profiles/slurm,\n"
              "--config KEY=VALUE to set one key of the job). --configfile is the job config every stage takes.")
        return 0
    snakefile = REPO / "workflow" / "Snakefile"
    if not snakefile.is_file():
        print(f"prism run: error: {snakefile} not found: prism run needs a source checkout of prism "
              "(pip install -e .)", file=sys.stderr)
        return 2
    argv = _absolute_configfiles(argv)  # Snakemake runs in the checkout: the user's relative paths still hold
    profile = [] if "--profile" in argv else ["--profile", str(REPO / "profiles" / "local")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), *profile, *argv]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def _absolute_configfiles(argv: list[str]) -> list[str]:
    out, in_files = [], False
    for arg in argv:
        if arg in ("--configfile", "--configfiles"):
            in_files = True
        elif arg.startswith("-"):
            in_files = False
        elif in_files:
            arg = str(Path(arg).resolve())
        out.append(arg)
    return out


def subcommand_usage(command: str, table: dict[str, tuple[str, str]]) -> str:
    """`usage: prism COMMAND {A,B} ...` and one line per subcommand."""
    lines = [f"usage: prism {command} {{{','.join(table)}}} [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in table.items()]
    lines += ["", f"prism {command} NAME --help shows a command's options."]
    return "\n".join(lines)


def run_slices(argv: list[str]) -> int:
    if not argv or argv[0] not in SLICES:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print(subcommand_usage("slices", SLICES), file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    return importlib.import_module(SLICES[argv[0]][0]).main(argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"prism {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean `prism {close[0]}`?)" if close else ""
        print(f"prism: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    if name == "run":
        return run_pipeline(rest)
    if name == "slices":
        return run_slices(rest)
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
