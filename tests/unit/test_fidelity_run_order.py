"""The fidelity bench's order of work in a config: nothing but the measured runs until the last one ended, then
every truth's graph (in parallel), then the scores; and its parallel steps (`_run_parallel`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from prism.bench import fidelity
from prism.bench.fidelity_table import Config


def test_truth_graphs_and_scores_come_after_the_last_measured_run(tmp_path, monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(fidelity, "run_truth", lambda cfg, args, out, log, timeout: order.append(f"truth {out.name}"))
    monkeypatch.setattr(fidelity, "run_prism", lambda cfg, args, p, job, *rest: order.append(f"prism {job.name}") or {})
    monkeypatch.setattr(fidelity, "truth_ends", lambda run: ([0, 1, 2], [0, 10**8, 2 * 10**8]))
    monkeypatch.setattr(fidelity, "truth_rank_ends", lambda run: ([], [], []))
    monkeypatch.setattr(fidelity.fidelity_sandbox, "rank_iteration_ms", lambda *a: [100.0])
    monkeypatch.setattr(fidelity, "build_truth_graphs",
                        lambda runs, log, timeout: order.append("graphs " + ",".join(r.name for r in runs)))
    monkeypatch.setattr(fidelity, "score_prism_run",
                        lambda res, job, truth0: order.append(f"score {job.name} against {truth0 and truth0.name}"))
    res = fidelity.run_config(Config("dp2", 2, ("--dp", "2"), 1), 1, repeats=3, prism_runs=2, steps=3, model=[],
                              work=tmp_path, timeout=60)
    assert res.error is None, res.error
    assert order == ["truth truth0", "prism prism0", "truth truth1", "prism prism1", "truth truth2",
                     "graphs truth0,truth1,truth2", "score prism0 against truth0", "score prism1 against None"]
    assert res.truth_ms == [100.0, 100.0, 100.0] and "truth-graphs" in res.stage_s


def _sleeper(mark: Path, seconds: float, code: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import time, pathlib; p = pathlib.Path({str(mark)!r}); "
            f"p.write_text(str(time.monotonic())); time.sleep({seconds}); "
            f"p.write_text(p.read_text() + ' ' + str(time.monotonic())); print('done', p.name); raise SystemExit({code})"]


def _spans(marks: list[Path]) -> list[tuple[float, float]]:
    return [tuple(float(x) for x in m.read_text().split()) for m in marks]


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    return max(sum(a <= t < b for a, b in spans) for t, _ in spans)


def test_parallel_steps_run_at_most_jobs_at_once_and_log_in_order(tmp_path):
    marks = [tmp_path / f"m{i}" for i in range(4)]
    log = tmp_path / "log.txt"
    fidelity._run_parallel([_sleeper(m, 0.5) for m in marks], log, timeout=60, jobs=2)
    spans = _spans(marks)
    assert _most_at_once(spans) == 2
    text = log.read_text()
    assert [line.split()[1] for line in text.splitlines() if line.startswith("done")] == ["m0", "m1", "m2", "m3"]
    assert text.count("$ ") == 4 and not list(tmp_path.glob(".log.txt.*"))


def test_a_failed_parallel_step_is_reported_once_all_ended(tmp_path):
    marks = [tmp_path / f"m{i}" for i in range(3)]
    cmds = [_sleeper(marks[0], 0.1, code=3), _sleeper(marks[1], 0.6), _sleeper(marks[2], 0.6)]
    t = time.monotonic()
    with pytest.raises(fidelity.StepError, match="exited 3"):
        fidelity._run_parallel(cmds, tmp_path / "log.txt", timeout=60, jobs=3)
    assert time.monotonic() - t >= 0.6  # the others were let finish
    assert all(len(s) == 2 for s in _spans(marks))


def test_a_template_that_does_not_start_leaves_new_zygotes(monkeypatch, capsys):
    def fail(env, timeout=120.0):
        raise RuntimeError("the zygote template did not start (exit 1)")

    monkeypatch.setattr(fidelity.zygote_template.Template, "start", staticmethod(fail))
    assert fidelity.start_template() is None
    assert "every launch starts a new zygote" in capsys.readouterr().err
