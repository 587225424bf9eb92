"""scripts/frameworks/torchtitan_timing_table.py: the timing matrix's table (torchtitan W=2 on CPU), its per-rank run
delay, the box's load while the timed steps ran, and the bar (a predicted median within torchrun's per-step spread)."""

import importlib.util

import numpy as np

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "frameworks" / "torchtitan_timing_table.py"


def _module():
    spec = importlib.util.spec_from_file_location("torchtitan_timing_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _lines(tmp_path, name="torchrun_1"):
    # rank, step: wall, cpu, proc, delay (s); steps 0.5 s apart, rank 1's run delay 0.1 s a step, rank 0's none
    text = "[cpu_train] rank 0 pinned to core 0, torch threads 1: 7 threads on [0]\n"
    for step in range(1, 4):
        for rank in (0, 1):
            text += (f"[cpu_train] rank {rank} step {step} loss 0x1.0p+2 wall {100 + step * 0.5 + rank * 0.01:.6f}"
                     f" cpu {step * 0.4:.6f} proc {step * 0.45:.6f} delay {rank * step * 0.1:.6f}\n")
    (tmp_path / f"{name}.txt").write_text(text)
    return _module().wrapper_lines(tmp_path / f"{name}.txt")


def test_the_pin_line_is_no_step_and_each_ranks_run_delay_is_its_own(tmp_path):
    mod = _module()
    lines = _lines(tmp_path)
    assert sorted(lines) == [(r, s) for r in (0, 1) for s in (1, 2, 3)]
    assert np.allclose(mod.rank_delays(lines), [0.0, 100.0])
    gaps, cpu, proc, delay = mod.from_lines(lines)
    assert np.allclose(gaps, [500.0, 500.0]) and np.isclose(cpu, 400.0) and np.isclose(delay, 50.0)


def test_load_only_while_the_timed_steps_ran(tmp_path):
    mod = _module()
    lines = _lines(tmp_path)  # steps at 100.5 .. 101.51: samples 98.5 .. 103.51 count
    (tmp_path / "load_torchrun_1.txt").write_text("90.0 9.00 9/100\n99.0 1.00 2/90\n101.0 3.00 4/90\n110.0 8.00 8/99\n")
    assert mod.load_during(tmp_path, "torchrun_1", lines) == "load1 2.00/3.00, runnable 3/4 (2 samples)"
    assert "not sampled" in mod.load_during(tmp_path, "torchrun_2", lines)


def test_the_bar_pooled_and_beside(capsys):
    truth = {1: np.array([500.0, 600.0]), 2: np.array([550.0, 700.0]), 3: np.array([400.0, 450.0])}
    predicted = {1: np.array([520.0, 540.0, 530.0]), 2: np.array([420.0, 430.0, 425.0])}
    _module().bar(truth, predicted, {1: np.array([530.0])})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("torchrun, every step of the 3 runs pooled: median 525.0, min-max 400.0-700.0 ms")
    assert "pooled spread 400.0-700.0 within; torchrun_1+2's 500.0-700.0 within" in out[1]
    assert "vs its pinned baseline's median 530.0: +0.0 %" in out[1]
    # 425: inside the pooled spread and inside torchrun 2 and 3's (400-700)
    assert "pooled spread 400.0-700.0 within; torchrun_2+3's 400.0-700.0 within" in out[2]
    _module().bar({1: np.array([500.0, 600.0])}, {1: np.array([450.0])}, {})
    assert "OUTSIDE by -50.0 ms (-10.0 % of 500.0)" in capsys.readouterr().out


def test_session_11s_results_still_make_their_table(capsys):
    _module().main(REPO / "docs" / "results" / "frameworks" / "timing_w2")
    out = capsys.readouterr().out
    assert "torchrun_1  torchrun, wall per step              1548.5" in out
    assert "prism_3     PREDICTED median 506.5 ms: pooled spread 495.7-1731.8 within" in out
