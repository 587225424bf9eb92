"""`prism bench overhead --interleave` end to end on CPU (gloo): one real-mode process a rank runs the reference
workload with PrismTrace switched off and on by blocks of steps; the off steps hold no hook in torch's global
dicts and record nothing, the on steps hold prism's four and record every marker of the step."""

import os

import pytest

from prism.bench import overhead

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nproc,block", [(1, 1), (2, 2)])
def test_interleaved_run_switches_recording_by_blocks(tmp_path, nproc, block, capsys):
    cores = sorted(os.sched_getaffinity(0))[-nproc:]
    workload = ["-m", "prism.workloads.moe_gpt", "--steps", "12", "--microbatches", "2"]
    run = overhead.run_interleaved(tmp_path / "run", nproc, workload, block, cores=cores)
    want = [((k - 1) // block) % 2 == 1 for k in range(1, 13)]
    assert run["on"] == want
    assert len(run["durations"]) == 12 and all(d > 0 for d in run["durations"])
    for on, events, hooks in zip(run["on"], run["events"], run["hooks"]):
        if on:
            assert hooks == 4
            # 2 microbatches: fwd/bwd begin and end each, an iteration end, and the compute between them (W=2: the
            # gradient all-reduces too)
            assert events >= 18
        else:
            assert (hooks, events) == (0, 0)
    assert len({e for e, o in zip(run["events"][4:], run["on"][4:]) if o}) == 1  # every on step records alike
    text = overhead.interleave_report([run], "CPU", nproc, cores, workload, 12, block, overhead.interleave_warmup(block),
                                      0.1, 0.03)
    assert f"W={nproc} pinned to core(s) {','.join(map(str, cores))}" in text
    assert "pairs (an on block / the mean of the off blocks either side): " in text
    assert "goal <= 3 %:" in text


def test_the_cli_prints_the_interleaved_table(capsys):
    assert overhead.main(["--interleave", "--nproc", "1", "--steps", "9", "--workload=--microbatches 1"]) == 0
    out = capsys.readouterr().out
    assert "prism bench overhead --interleave: CPU, W=1" in out
    assert out.count("\noff ") == 1 and out.count("\non ") == 1
    assert "warning: 2 pair(s) are too few" in out
