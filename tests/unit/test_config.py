"""Config: the embedded default and the test config validate; bad configs name the key."""

import subprocess
import sys

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


def test_a_script_config_stands_alone(tmp_path):
    """A `workload.script` config is valid on its own (nothing of the default job's `module` is merged in)."""
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump({"job": "s", "nproc": 2, "workload": {"script": "train.py", "args": ["--x"]}}))
    job = config.load(path)
    assert job.workload.command() == ["train.py", "--x"]
    assert (job.device, job.results, job.capture.devices, job.baseline.run) == ("cpu", "results", 2, "auto")


def test_left_out_workload_args_are_not_taken_from_the_default_job():
    job = config.from_dict({"job": "x", "nproc": 4, "workload": {"module": "prism.workloads.moe_gpt",
                                                                 "args": {"tp": 2, "pp": 2}}})
    assert job.workload.args == ["--tp", "2", "--pp", "2", "--device", "cpu"]  # no dp/ep/steps of the default


def test_defaults_come_from_the_schema():
    filled = config.with_defaults({"job": "x", "nproc": 1, "workload": {"module": "m"}})
    assert filled == {"job": "x", "nproc": 1, "workload": {"module": "m"}, "device": "cpu", "results": "results",
                      "baseline": {"run": "auto", "pin": True}, "capture": {"devices": 2, "payloads": True},
                      "slices": {"keep_whole": [], "plan_rule": "sync-first"}, "calibrate": {"timed_slices": False}}
    assert config.with_defaults({"capture": {"devices": 1}})["capture"] == {"devices": 1, "payloads": True}


def test_device_goes_to_the_reference_workload_and_the_ranks():
    base = {"job": "x", "nproc": 2, "workload": {"module": "prism.workloads.moe_gpt"}}
    job = config.from_dict({**base, "device": "cuda"})
    assert job.workload.args == ["--device", "cuda"] and job.environment() == {"PRISM_DEVICE": "cuda"}
    other = config.from_dict({"job": "x", "nproc": 2, "workload": {"script": "t.py"}, "device": "cuda"})
    assert other.workload.args == []  # another program is not given flags it may not know
    with pytest.raises(config.ConfigError, match="'device'"):
        config.from_dict({**base, "workload": {**base["workload"], "args": {"device": "cuda"}}})
    with pytest.raises(config.ConfigError, match="'device'"):
        config.from_dict({**base, "device": "gpu"})


def test_capture_devices_beyond_the_cpu_affinity_are_refused():
    import os

    cores = len(os.sched_getaffinity(0))
    raw = {"job": "x", "nproc": 2, "workload": {"module": "m"}, "capture": {"devices": cores + 1}}
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(raw, "job.yaml")
    assert "'capture.devices'" in str(err.value) and f"at most {cores}" in str(err.value)
    assert config.from_dict({**raw, "capture": {"devices": cores}}).capture.devices == cores


def test_loading_a_config_skips_the_slow_iri_format_checker():
    # jsonschema imports rfc3987_syntax where it is installed (Jupyter's jsonschema[format-nongpl]; here through
    # the test extra's HolisticTraceAnalysis), which costs ~2.5 s of CPU per process: every stage and Snakemake run
    # loads a config. prism.config imports jsonschema without it, and leaves it importable for anything else.
    code = ("import importlib.util, sys; import prism.config as c; "
            "assert 'rfc3987_syntax' not in sys.modules, 'rfc3987_syntax was imported'; "
            "c.validate({'job': 'x', 'nproc': 2, 'workload': {'module': 'm'}}); "
            "spec = importlib.util.find_spec('rfc3987_syntax'); "
            "spec is None or __import__('rfc3987_syntax'); print('installed' if spec else 'absent')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("installed", "absent")


def test_slices_section_names_the_groups_kept_whole():
    base = {"job": "x", "nproc": 2, "workload": {"module": "m"}}
    assert config.from_dict(base).slices.keep_whole == ()
    assert config.from_dict({**base, "slices": {"keep_whole": ["tp", "ep"]}}).slices.keep_whole == ("tp", "ep")
    with pytest.raises(config.ConfigError, match="'slices.keep_whole'"):
        config.from_dict({**base, "slices": {"keep_whole": "tp"}})
    with pytest.raises(config.ConfigError, match="'slices'"):
        config.from_dict({**base, "slices": {"keep": ["tp"]}})


def test_slices_section_names_the_plan_rule():
    base = {"job": "x", "nproc": 2, "workload": {"module": "m"}}
    assert config.from_dict(base).slices.plan_rule == "sync-first"
    assert config.from_dict({**base, "slices": {"plan_rule": "bytes"}}).slices.plan_rule == "bytes"
    with pytest.raises(config.ConfigError, match="'slices.plan_rule'"):
        config.from_dict({**base, "slices": {"plan_rule": "fastest"}})
