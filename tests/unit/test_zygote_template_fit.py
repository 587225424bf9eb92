"""Which launches a warm zygote template serves (`zygote_template.mismatch`): the environment a zygote imports torch
with must be the template's, but for prism's own variables and the torch variables the launcher sets per mode."""

from __future__ import annotations

from prism.runtime.launch import zygote_template
from prism.runtime.launch.zygote import import_environment

BASE = {"PATH": "/usr/bin", "PYTHONPATH": "/site:/repo", "OMP_NUM_THREADS": "1", "PRISM_MODE": "real"}


def template(env: dict[str, str]) -> dict:
    return {"executable": "/venv/bin/python", "env": import_environment(env, pin=True), "pid": 1}


def test_a_launch_with_the_templates_environment_fits():
    assert zygote_template.mismatch(template(BASE), BASE, pin=True, executable="/venv/bin/python") is None


def test_prisms_variables_and_the_per_mode_torch_ones_may_differ():
    launch = dict(BASE, PRISM_MODE="capture", PRISM_OUT="/tmp/x", PRISM_CORES="0,1", TORCH_DIST_INIT_BARRIER="0",
                  TORCHELASTIC_USE_AGENT_STORE="True", TORCH_GLOO_LAZY_INIT="1")
    assert zygote_template.mismatch(template(BASE), launch, pin=False, executable="/venv/bin/python") is None


def test_any_other_variable_that_differs_is_named():
    why = zygote_template.mismatch(template(BASE), dict(BASE, TORCH_LOGS="+dynamo", PYTHONPATH="/other"), pin=True,
                                   executable="/venv/bin/python")
    assert why is not None and "PYTHONPATH" in why and "TORCH_LOGS" in why
    missing = dict(BASE)
    del missing["PATH"]
    assert "PATH" in zygote_template.mismatch(template(BASE), missing, pin=True, executable="/venv/bin/python")


def test_the_thread_count_a_zygote_sets_itself_counts():
    # pinned, a zygote imports torch with one OpenMP thread whatever the launcher's environment says
    unset = {k: v for k, v in BASE.items() if k != "OMP_NUM_THREADS"}
    assert zygote_template.mismatch(template(BASE), unset, pin=True, executable="/venv/bin/python") is None
    why = zygote_template.mismatch(template(BASE), unset, pin=False, executable="/venv/bin/python")
    assert why is not None and "OMP_NUM_THREADS" in why


def test_another_python_or_no_recording_mode_is_refused():
    assert "another Python" in zygote_template.mismatch(template(BASE), BASE, pin=True, executable="/usr/bin/python3")
    off = {k: v for k, v in BASE.items() if k != "PRISM_MODE"}
    assert "no recording mode" in zygote_template.mismatch(template(BASE), off, pin=True,
                                                           executable="/venv/bin/python")
