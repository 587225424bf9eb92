"""The `prism` command: --help lists every stage, --version, unknown commands get a hint, and every
`prism COMMAND` that a message or doc of the package names is a command that exists."""

from __future__ import annotations

import re

from prism import __version__, cli
from tests.conftest import REPO, run_prism

PIPELINE = ("run", "baseline", "capture", "graph", "slices", "calibrate", "emulate", "summary", "report")


def test_help_lists_every_stage_and_tool():
    proc = run_prism(["--help"])
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  ([a-z]+) ", proc.stdout, re.M)
    assert listed == [*PIPELINE, "export", "sql", "launch", "bench", "profiles"]
    assert "--version" in proc.stdout
    bare = run_prism([])
    assert bare.returncode == 2 and "pipeline stages" in bare.stdout


def test_version():
    proc = run_prism(["--version"])
    assert proc.returncode == 0 and proc.stdout.strip() == f"prism {__version__}"


def test_unknown_command_names_the_closest_one():
    proc = run_prism(["reprot"])
    assert proc.returncode == 2
    assert "unknown command 'reprot' (did you mean `prism report`?)" in proc.stderr


def test_every_subcommand_has_help():
    for name in cli.COMMANDS:
        proc = run_prism([name, "--help"], timeout=120)
        assert proc.returncode == 0, (name, proc.stderr[-500:])
        assert "usage" in (proc.stdout + proc.stderr).lower(), name


def test_slices_dispatches_to_plan_and_run():
    proc = run_prism(["slices", "plan", "--help"])
    assert proc.returncode == 0 and "--devices" in proc.stdout
    assert run_prism(["slices"]).returncode == 2


def test_commands_named_in_messages_and_docs_exist():
    """`prism X` in backticks (the hints errors give, the README's commands) must be a real command."""
    files = [*sorted((REPO / "prism").rglob("*.py")), REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = {}
    for path in files:
        if not path.is_file():
            continue
        for match in re.finditer(r"`prism ([a-z_]+)", path.read_text(encoding="utf-8")):
            named.setdefault(match.group(1), str(path.relative_to(REPO)))
    assert named, "no `prism COMMAND` found: the pattern is wrong"
    unknown = {name: where for name, where in named.items() if name not in cli.COMMANDS}
    assert unknown == {}


def test_run_passes_configfiles_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = cli._absolute_configfiles(["-n", "--configfile", "a.yaml", "--config", "results=r", "--configfiles",
                                     "b.yaml", "c.yaml", "-j", "2"])
    assert got == ["-n", "--configfile", str(tmp_path / "a.yaml"), "--config", "results=r", "--configfiles",
                   str(tmp_path / "b.yaml"), str(tmp_path / "c.yaml"), "-j", "2"]


def test_usage_lines_name_the_prism_command():
    """Every stage's usage line is the command a user types (`prism graph`, not `python -m prism.graph`)."""
    for argv, usage in ((["graph"], "usage: prism graph"), (["calibrate"], "usage: prism calibrate"),
                        (["summary"], "usage: prism summary"), (["slices", "plan"], "usage: prism slices plan"),
                        (["slices", "run"], "usage: prism slices run"),
                        (["slices", "durations"], "usage: prism slices durations"),
                        (["report"], "usage: prism report"), (["baseline"], "usage: prism baseline")):
        proc = run_prism([*argv, "--help"], timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith(usage), (argv, proc.stdout[:200])
        assert "python -m" not in proc.stdout.splitlines()[0]


def test_slices_and_bench_list_their_subcommands():
    from prism import bench

    for name, table in (("slices", cli.SLICES), ("bench", bench.BENCHES)):
        proc = run_prism([name, "--help"], timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"usage: prism {name} {{")
        for sub, (_, help_) in table.items():
            assert f"  {sub:<10} {help_}" in proc.stdout, (name, sub)
        wrong = run_prism([name, "nope"], timeout=120)
        assert wrong.returncode == 2 and "commands:" in wrong.stderr


def test_slices_run_all_needs_the_plan(tmp_path):
    proc = run_prism(["slices", "run", "--job", str(tmp_path), "--all"])
    assert proc.returncode == 2 and "plan.parquet is missing" in proc.stderr and "prism slices plan" in proc.stderr
    both = run_prism(["slices", "run", "--job", str(tmp_path), "--all", "--slice", "0"])
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_stages_take_configfile_and_keep_config_as_its_alias(tmp_path):
    bad = tmp_path / "none.yaml"
    for flag in ("--configfile", "--config"):
        proc = run_prism(["capture", flag, str(bad)])
        assert proc.returncode == 2 and f"config file not found: {bad}" in proc.stderr, (flag, proc.stderr)
