"""`baseline.run: auto` is decided on the machine that would run the baseline (`prism baseline --decide`), and the
decision says why, in words the report can quote."""

from __future__ import annotations

import json

from prism import baseline
from prism import config as prism_config


def _job(run: str, nproc: int) -> prism_config.JobConfig:
    return prism_config.from_dict({"job": "j", "nproc": nproc, "workload": {"module": "m"},
                                   "baseline": {"run": run}, "capture": {"devices": 1}}, "test")


def test_auto_runs_only_where_w_fits_one_core_per_rank():
    fits = baseline.decision(_job("auto", 2), cores=2)
    assert fits["run"] is True and "fit" in fits["reason"]
    skipped = baseline.decision(_job("auto", 16), cores=2)
    assert skipped["run"] is False
    assert "W=16" in skipped["reason"] and "2 cores" in skipped["reason"] and "always" in skipped["reason"]
    assert baseline.decision(_job("always", 16), cores=2)["run"] is True
    assert baseline.decision(_job("never", 1), cores=2)["run"] is False


def test_decide_writes_the_decision_and_launches_nothing(tmp_path, capsys):
    out = tmp_path / "baseline" / "decision.json"
    section = json.dumps({"job": "j", "nproc": 4096, "workload": {"module": "prism.workloads.no_such"},
                          "baseline": {"run": "auto"}, "capture": {"devices": 1}})
    assert baseline.main(["--config-json", section, "--decide", str(out)]) == 0
    made = json.loads(out.read_text())
    assert made["run"] is False and made["nproc"] == 4096 and made["setting"] == "auto"
    assert sorted(p.name for p in out.parent.iterdir()) == ["decision.json"]  # no raw/, no temp file left
    assert "skipped" in capsys.readouterr().err
