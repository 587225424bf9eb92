"""Config: the embedded default and the test config validate; bad configs name the key."""

import pytest
import yaml

from prism import config
from tests.conftest import REPO, data_path, run_prism


def test_default_config_loads():
    job = config.load()
    assert job.job == "default" and job.nproc == 16
    assert job.workload.command()[:2] == ["-m", "prism.workloads.moe_gpt"]
    assert "--tp" in job.workload.args


def test_tiny_config_loads():
    job = config.load(data_path("tiny.yaml"))
    assert job.nproc == 2 and job.baseline.wanted(2, cores=2)


def test_emulate_section():
    assert config.load().emulate.wanted and config.load(data_path("tiny.yaml")).emulate.sandbox == "1"
    assert not config.from_dict({"job": "x", "nproc": 2, "workload": {"module": "m"},
                                 "emulate": {"run": False}}).emulate.wanted
    base = {"job": "x", "nproc": 2, "workload": {"module": "m"}}
    assert not config.from_dict(base).emulate.wanted
    e = config.from_dict({**base, "emulate": {"sandbox": "pp=last", "prefetch_mb": 8, "pruning": False}}).emulate
    assert (e.wanted, e.sandbox, e.prefetch_mb, e.pruning, e.devices) == (True, "pp=last", 8, False, None)
    with pytest.raises(config.ConfigError, match="'emulate'"):
        config.from_dict({**base, "emulate": {"sandboxes": "1"}})
    with pytest.raises(config.ConfigError, match="'emulate.devices'"):
        config.from_dict({**base, "emulate": {"devices": 0}})


def test_args_mapping_becomes_flags():
    assert config.args_to_list({"tp": 2, "var_seq": True, "off": False}) == ["--tp", "2", "--var-seq"]
    assert config.args_to_list(["--x", 3]) == ["--x", "3"]


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"job": "x", "nproc": 0, "workload": {"module": "m"}}, "nproc"),
        ({"job": "x", "nproc": 2, "workload": {"module": "m"}, "baseline": {"runn": "auto"}}, "baseline"),
        ({"job": "x", "nproc": 2, "workload": {"module": "m", "script": "s"}}, "workload"),
        ({"job": "x y", "nproc": 2, "workload": {"module": "m"}}, "job"),
        ({"job": "x", "nproc": 2, "workload": {"module": "m"}, "baseline": {"run": "sometimes"}}, "baseline.run"),
    ],
)
def test_bad_config_names_the_key(raw, key):
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(raw, "job.yaml")
    assert f"'{key}'" in str(err.value) and "job.yaml" in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(bad)


def test_baseline_cli_rejects_bad_config_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"job": "x", "nproc": "two", "workload": {"module": "m"}}))
    proc = run_prism(["baseline", "--config", str(bad), "--out", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert "'nproc'" in proc.stderr and not (tmp_path / "out" / "raw").exists()


def test_schema_file_is_the_one_the_snakefile_validates_against():
    text = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "schemas/config.schema.yaml" in text
    assert config.SCHEMA_PATH == REPO / "schemas" / "config.schema.yaml"
