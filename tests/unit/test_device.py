"""The job runs where its config says: CPU unless asked, recorded in meta.json and shown in the summary."""

from __future__ import annotations

import json

import pytest

from prism import graph, summary
from prism.workloads import moe_gpt
from rawgen import megatron_job
from tests.conftest import run_prism


def test_the_reference_workload_defaults_to_cpu():
    assert moe_gpt.parse_args([]).device == "cpu"


def test_the_summary_names_the_device(tmp_path, capsys):
    job = megatron_job(tp=2, dp=2, iterations=2)
    job.device = "cuda"
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    assert summary.main(["--job", str(tmp_path)]) == 0
    assert "mode: real, device: cuda" in (tmp_path / "summary.txt").read_text()


@pytest.mark.slow
def test_the_baseline_runs_where_the_config_says(tmp_path):
    config = {"job": "d", "nproc": 2, "workload": {"module": "prism.workloads.moe_gpt",
                                                   "args": {"dp": 2, "ep": 2, "steps": 1, "microbatches": 1}}}
    proc = run_prism(["baseline", "--config-json", json.dumps(config), "--out", str(tmp_path / "out")],
                     PRISM_DEVICE="cuda")  # the config, not the caller's environment, decides
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "out" / "raw" / "meta.json").read_text())
    assert meta["device"] == "cpu" and meta["command"][-2:] == ["--device", "cpu"]
    assert len(meta["run_id"]) >= 12
