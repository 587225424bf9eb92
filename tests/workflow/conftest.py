"""Fixtures of the workflow tests: one local run of the tiny job that several tests compare against, and a
private single-node SLURM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workflow.runs import snakemake, tiny_args
from tests.workflow.slurm_cluster import SlurmCluster, SlurmUnavailable, missing_requirements


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory) -> Path:
    """The tiny job run once locally (`--profile profiles/local`); returns its job folder. Read it, never write."""
    results = tmp_path_factory.mktemp("tiny_reference")
    proc = snakemake(*tiny_args(results))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results / "tiny"


def started_cluster(root: Path, nodes: int = 1) -> SlurmCluster:
    """A private SLURM (`SlurmCluster`) started in `root`. Skips where it cannot start, unless
    PRISM_REQUIRE_SLURM=1 (what .ci/run sets after installing the packages): then that is a failure."""
    required = os.environ.get("PRISM_REQUIRE_SLURM") == "1"
    why = missing_requirements(link=nodes == 1)
    if why:
        if required:
            pytest.fail(f"PRISM_REQUIRE_SLURM=1 but SLURM cannot run: {why}")
        pytest.skip(f"SLURM unavailable: {why}")
    cluster = SlurmCluster(root, nodes=nodes)
    try:
        cluster.start()
    except SlurmUnavailable as e:
        if required:
            pytest.fail(f"PRISM_REQUIRE_SLURM=1 but SLURM ({nodes} node(s)) did not start: {e}")
        pytest.skip(f"SLURM ({nodes} node(s)) did not start: {e}")
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A single-node SLURM from Debian's slurm-wlm + munge (`started_cluster`)."""
    # short root: munge's socket path must stay under the 108-byte limit of a unix socket name
    cluster = started_cluster(Path(tmp_path_factory.mktemp("slurm")))
    yield cluster
    cluster.stop()
