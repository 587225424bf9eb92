"""A --configfile stands alone: nothing of the embedded default job is merged into it (dry runs)."""

from __future__ import annotations

import yaml

from tests.workflow.test_workflow import snakemake


def _dry_run(tmp_path, raw: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return snakemake("--profile", "profiles/local", "-n", "-p", "--configfile", str(path),
                     "--config", f"results={tmp_path}")


def test_a_script_config_passes(tmp_path):
    proc = _dry_run(tmp_path, {"job": "s", "nproc": 2, "workload": {"script": "train.py", "args": ["--epochs", "1"]}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert '"script": "train.py"' in out and "prism.workloads.moe_gpt" not in out


def test_workload_args_left_out_are_not_taken_from_the_default_job(tmp_path):
    proc = _dry_run(tmp_path, {"job": "w4", "nproc": 4,
                               "workload": {"module": "prism.workloads.moe_gpt", "args": {"tp": 2, "pp": 2}}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert '"args": {"pp": 2, "tp": 2}' in out  # the default job's dp 4, ep 2, steps 4 are not merged in
    assert '"device": "cpu"' in out  # the schema's default


def test_no_configfile_runs_the_default_job_with_config_overrides(tmp_path):
    proc = snakemake("--profile", "profiles/local", "-n", "-p", "--config", f"results={tmp_path}", "device=cpu")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{tmp_path}/default/summary.txt" in out and '"dp": 4' in out


def test_the_groups_kept_whole_reach_the_slice_plan(tmp_path):
    proc = _dry_run(tmp_path, {"job": "k", "nproc": 4, "slices": {"keep_whole": ["tp", "ep"]},
                               "workload": {"module": "prism.workloads.moe_gpt", "args": {"tp": 2}}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "prism.slices.plan" in out and "--keep-whole=tp,ep" in out and "--rule=sync-first" in out


def test_the_plan_rule_reaches_the_slice_plan(tmp_path):
    proc = _dry_run(tmp_path, {"job": "k", "nproc": 4, "slices": {"plan_rule": "bytes"},
                               "workload": {"module": "prism.workloads.moe_gpt", "args": {"tp": 2}}})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "--rule=bytes" in out
