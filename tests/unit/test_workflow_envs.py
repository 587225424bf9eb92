"""Every rule names its own environment under workflow/envs/, and the rules given the analysis environment (no
PyTorch in it) run stages that never import torch."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from tests.conftest import REPO

RULE = re.compile(r"^(?:rule|checkpoint) (\w+):[^\n]*\n(.*?)(?=^(?:rule|checkpoint) |\Z)", re.S | re.M)


def _rules() -> dict[str, tuple[str, str]]:
    """rule: (its conda env file, the prism module its shell runs)."""
    found = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for name, body in RULE.findall(smk.read_text()):
            env = re.search(r'conda:\n\s+"\.\./envs/([\w-]+\.yaml)"', body)
            module = re.search(r"\$PY -m (prism[\w.]*)", body)
            found[name] = (env.group(1) if env else None, module.group(1) if module else None)
    return found


def test_every_rule_has_an_environment_of_its_own_kind():
    rules = _rules()
    assert len(rules) >= 15
    assert {name for name, (env, _) in rules.items() if env is None} == set()
    for env in {env for env, _ in rules.values()}:
        spec = yaml.safe_load((REPO / "workflow" / "envs" / env).read_text())
        assert "python=3.11" in spec["dependencies"], env
    runtime = {name for name, (env, _) in rules.items() if env == "runtime.yaml"}
    assert runtime == {"baseline_decision", "baseline_run", "capture", "slice_run", "slice_run_timed", "emulate"}


def test_the_analysis_stages_never_import_torch():
    modules = sorted({module for env, module in _rules().values() if env == "analysis.yaml"})
    assert "prism.graph" in modules and "prism.report" in modules
    code = ("import importlib, runpy, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m + '.stage' if m in ('prism.calibrate', 'prism.report') else m)\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", "an analysis stage imports torch: it needs envs/runtime.yaml"
