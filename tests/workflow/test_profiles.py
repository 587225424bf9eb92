"""`prism profiles install`: prism's profiles land where `snakemake --profile NAME` finds them."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO, data_path, run_prism
from tests.workflow.runs import snakemake, snakemake_env


def test_install_then_snakemake_finds_the_profile_by_name(tmp_path):
    home = str(tmp_path / "config")
    proc = run_prism(["profiles", "install"], XDG_CONFIG_HOME=home)
    assert proc.returncode == 0, proc.stderr
    for name in ("local", "slurm"):
        installed = tmp_path / "config" / "snakemake" / name / "config.yaml"
        assert installed.read_bytes() == (REPO / "profiles" / name / "config.yaml").read_bytes()
        assert f"snakemake --profile {name}" in proc.stdout
    dry = snakemake("--profile", "slurm", "-n", "--configfile", str(data_path("tiny.yaml")),
                    "--config", f"results={tmp_path}", env=snakemake_env(XDG_CONFIG_HOME=home))
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out
    assert "Using profile slurm" in out and "capture" in out
    # installing again changes nothing and succeeds
    assert run_prism(["profiles", "install"], XDG_CONFIG_HOME=home).returncode == 0


def test_a_different_profile_of_the_same_name_is_kept_unless_forced(tmp_path):
    home = str(tmp_path / "config")
    mine = tmp_path / "config" / "snakemake" / "slurm" / "config.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("executor: slurm\njobs: 1\n")
    proc = run_prism(["profiles", "install", "slurm"], XDG_CONFIG_HOME=home)
    assert proc.returncode == 1
    assert str(mine.parent) in proc.stderr and "--force" in proc.stderr
    assert mine.read_text() == "executor: slurm\njobs: 1\n"
    forced = run_prism(["profiles", "install", "--force", "slurm"], XDG_CONFIG_HOME=home)
    assert forced.returncode == 0, forced.stderr
    assert mine.read_bytes() == (REPO / "profiles" / "slurm" / "config.yaml").read_bytes()
    assert not (tmp_path / "config" / "snakemake" / "local").exists()


def test_an_unknown_profile_is_named_with_the_ones_that_exist(tmp_path):
    proc = run_prism(["profiles", "install", "slurmm"], XDG_CONFIG_HOME=str(tmp_path))
    assert proc.returncode == 1
    assert "slurmm" in proc.stderr and "local, slurm" in proc.stderr


def test_nothing_is_installed_when_one_profile_is_refused(tmp_path):
    """Issue 23: with `slurm` edited and `local` missing, `install` installed `local`, refused `slurm`, and
    said only the refusal."""
    home = tmp_path / "config"
    mine = home / "snakemake" / "slurm" / "config.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("executor: slurm\njobs: 1\n")
    proc = run_prism(["profiles", "install"], XDG_CONFIG_HOME=str(home))
    assert proc.returncode == 1 and "nothing installed" in proc.stderr and "local" in proc.stderr, proc.stderr
    assert not (home / "snakemake" / "local").exists() and mine.read_text() == "executor: slurm\njobs: 1\n"


def test_a_file_where_the_profile_goes_and_an_unwritable_config_folder(tmp_path):
    home = tmp_path / "config"
    (home / "snakemake").mkdir(parents=True)
    (home / "snakemake" / "local").write_text("not a folder")
    proc = run_prism(["profiles", "install", "local"], XDG_CONFIG_HOME=str(home))
    assert proc.returncode == 1 and str(home / "snakemake" / "local") in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    forced = run_prism(["profiles", "install", "--force", "local"], XDG_CONFIG_HOME=str(home))
    assert forced.returncode == 0 and (home / "snakemake" / "local" / "config.yaml").is_file(), forced.stderr

    blocked = tmp_path / "file"
    blocked.write_text("XDG_CONFIG_HOME is a file")
    proc = run_prism(["profiles", "install"], XDG_CONFIG_HOME=str(blocked))
    assert proc.returncode == 1 and str(blocked) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    unwritable = Path("/sys/prism-test") if os.geteuid() == 0 else locked / "sub"  # root writes any folder
    proc = run_prism(["profiles", "install"], XDG_CONFIG_HOME=str(unwritable))
    assert proc.returncode == 1 and str(unwritable) in proc.stderr and "writable" in proc.stderr, proc.stderr
    assert "a file stands" not in proc.stderr, proc.stderr

    missing = Path("/proc/prism-test")  # a folder that cannot be made (no file stands there): not a file's fault
    proc = run_prism(["profiles", "install"], XDG_CONFIG_HOME=str(missing))
    assert proc.returncode == 1 and str(missing) in proc.stderr and "writable" in proc.stderr, proc.stderr
    assert "a file stands" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
