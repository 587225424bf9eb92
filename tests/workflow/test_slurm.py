"""The pipeline on a real (single-node, private) SLURM through profiles/slurm, exactly as the README's cluster
section says: `prism profiles install` then `snakemake --profile slurm`, and `--profile profiles/slurm`."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.conftest import REPO, run_prism
from tests.workflow.runs import SNAKEMAKE, differences, snakemake, snakemake_env, tiny_args

pytestmark = pytest.mark.slow


def _active_jobs(cluster) -> list[str]:
    return [line for line in cluster.squeue() if line.split()[1] in ("PENDING", "RUNNING", "CONFIGURING",
                                                                      "COMPLETING", "SUSPENDED")]


@pytest.mark.timeout(1800)
def test_tiny_job_through_slurm_equals_the_local_run(slurm_cluster, tiny_reference, tmp_path):
    config_home = tmp_path / "config"
    env = snakemake_env(XDG_CONFIG_HOME=str(config_home), **slurm_cluster.env)
    installed = run_prism(["profiles", "install"], XDG_CONFIG_HOME=str(config_home))
    assert installed.returncode == 0, installed.stderr
    assert (config_home / "snakemake" / "slurm" / "config.yaml").is_file()

    results = tmp_path / "results"
    started = time.monotonic()
    proc = snakemake(*tiny_args(results, "slurm"), env=env, timeout=1500)
    wall = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out + slurm_cluster.logs()
    assert "Using profile slurm" in out
    # the stages went through SLURM (the summaries are local rules)
    for rule in ("baseline_run", "capture", "graph", "baseline_graph", "slice_plan", "slice_run", "calibrate"):
        assert f"rule_{rule}/" in out, f"{rule} was not submitted to SLURM"
    assert not _active_jobs(slurm_cluster)
    # the same artifacts as a local run, measured values aside
    assert differences(tiny_reference, results / "tiny") == []
    print(f"tiny job through SLURM: {wall:.0f} s")


@pytest.mark.timeout(600)
def test_a_failing_rule_is_reported_not_waited_on(slurm_cluster, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: bad\nnproc: 2\nworkload: {module: prism.workloads.no_such_workload}\n"
                   "baseline: {run: never}\n")
    started = time.monotonic()
    proc = snakemake("--profile", "profiles/slurm", "--configfile", str(bad), "--config", f"results={tmp_path}",
                     env=snakemake_env(**slurm_cluster.env), timeout=300)
    wall = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Error in rule capture" in out and "SLURM-job" in out and "FAILED" in out, out
    assert wall < 240, f"the failure took {wall:.0f} s to be reported"
    assert not _active_jobs(slurm_cluster)
    assert not (tmp_path / "bad" / "capture" / "raw").exists()


@pytest.mark.timeout(600)
def test_interrupting_snakemake_cancels_its_slurm_jobs(slurm_cluster, tmp_path):
    log = tmp_path / "snakemake.log"
    log_file = open(log, "w")
    proc = subprocess.Popen([*SNAKEMAKE, *tiny_args(tmp_path, "profiles/slurm", "baseline={run: never}")],
                            cwd=REPO, env=snakemake_env(**slurm_cluster.env), stdout=log_file,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not (any(" RUNNING " in line for line in _active_jobs(slurm_cluster))
                   and "has been submitted with SLURM jobid" in log.read_text()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no SLURM job started"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends Snakemake
        try:
            proc.wait(timeout=8)  # a handled SIGINT ends it in ~2 s
        except subprocess.TimeoutExpired:
            # Python's asyncio takes a first Ctrl-C as "cancel the running coroutine" and only a second one as
            # KeyboardInterrupt; Snakemake (9.27, slurm plugin 2.8) was seen to absorb the first and run on to the
            # end (3 of 6 runs of this file on 2026-12-01). A user presses Ctrl-C again: so does this test.
            print("the first SIGINT was absorbed: sent a second")
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_file.close()
    out = log.read_text()
    assert proc.returncode != 0, out
    assert "Terminating processes on user request" in out, out
    assert not _active_jobs(slurm_cluster), out
    assert any(" CANCELLED " in line for line in slurm_cluster.squeue())
