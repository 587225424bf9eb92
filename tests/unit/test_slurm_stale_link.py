"""The private test SLURM's /etc/slurm/slurm.conf link: a link left by a killed test run is removed, a live
cluster's link or a real SLURM's file is not (a killed `make test` once left the link and failed the next CI run)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.workflow import slurm_cluster as sc


@pytest.fixture
def conf_link(tmp_path, monkeypatch):
    link = tmp_path / "etc" / "slurm.conf"
    link.parent.mkdir()
    monkeypatch.setattr(sc, "DEFAULT_CONF", link)
    return link


def _cluster_dir(tmp_path, pid: int):
    root = tmp_path / "slurm0"
    (root / "run").mkdir(parents=True)
    (root / "slurm.conf").write_text("ClusterName=prismtest\n")
    (root / "run" / "slurmctld.pid").write_text(f"{pid}\n")
    return root


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_killed_runs_link_is_removed(tmp_path, conf_link):
    root = _cluster_dir(tmp_path, _dead_pid())
    conf_link.symlink_to(root / "slurm.conf")
    assert sc.clear_stale_link() == root / "slurm.conf"
    assert not conf_link.is_symlink()


def test_a_link_to_nothing_is_removed(tmp_path, conf_link):
    conf_link.symlink_to(tmp_path / "gone" / "slurm.conf")
    assert sc.clear_stale_link() is not None
    assert not conf_link.is_symlink()


def test_a_live_test_clusters_link_stays(tmp_path, conf_link):
    root = _cluster_dir(tmp_path, os.getpid())
    conf_link.symlink_to(root / "slurm.conf")
    assert sc.clear_stale_link() is None
    assert conf_link.is_symlink()


def test_a_real_slurms_config_stays(tmp_path, conf_link):
    real = tmp_path / "site.conf"
    real.write_text("ClusterName=production\n")
    conf_link.symlink_to(real)
    assert sc.clear_stale_link() is None
    conf_link.unlink()
    conf_link.write_text("ClusterName=production\n")
    assert sc.clear_stale_link() is None
    assert conf_link.read_text() == "ClusterName=production\n"
