"""A capture over hosts as a SLURM two-step allocation: a private SLURM of two "nodes" on this machine (two
slurmd, `slurm_cluster.SlurmCluster(nodes=2)`), `salloc -N 2` of scripts/slurm_launch.sh, which runs one
`prism launch --nnodes 2 --node-rank $SLURM_NODEID ...` per node through srun: the artifacts equal a one-host
capture of the same job but for the host columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.runtime.launch.launcher import free_port
from tests.conftest import REPO, run_prism, run_together
from tests.integration.test_capture_hosts import PROG, _what_ranks_did
from tests.workflow.conftest import started_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two SLURM nodes on this machine (skips where SLURM cannot start, as `slurm_cluster`)."""
    cluster = started_cluster(Path(tmp_path_factory.mktemp("slurm2")), nodes=2)
    yield cluster
    cluster.stop()


def test_a_two_node_allocation_captures_as_one_host(two_nodes, tmp_path):
    job, one = tmp_path / "job", tmp_path / "one"
    prog = [PROG, "--steps", "3"]
    env = {**os.environ, **two_nodes.env, "PRISM_PYTHON": sys.executable, "PRISM_MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    # salloc, not sbatch --wait: the same script and steps, but sbatch --wait polls the job's state with a
    # growing interval (here it returned 10-35 s after the job ended); salloc returns when the script does
    cmd = ["salloc", "-N", "2", "--ntasks-per-node=1", f"--chdir={REPO}", str(REPO / "scripts" / "slurm_launch.sh"), "--nproc", "2", "--devices", "1", "--mode", "capture",
           "--out", str(job), *prog]
    salloc, single = run_together(
        lambda: subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300),
        lambda: run_prism(["launch", "--nproc", "4", "--devices", "2", "--mode", "capture", "--out", str(one), *prog],
                          timeout=300))
    out = salloc.stdout
    assert salloc.returncode == 0, salloc.stdout + salloc.stderr + two_nodes.logs()
    assert single.returncode == 0, single.stderr
    assert out.count("step=3 sum=") == 1  # rank 0, on the allocation's first node
    assert _what_ranks_did(job) == _what_ranks_did(one)
    meta = json.loads((job / "raw" / "meta.json").read_text())
    assert meta["world_size"] == 4 and meta["nnodes"] == 2 and [h["ranks"] for h in meta["hosts"]] == [[0, 2], [2, 4]]
    assert meta["capture"]["bridge"]["frames_out"] > 0
