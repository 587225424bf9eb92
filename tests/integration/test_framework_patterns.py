"""Real frameworks' training-loop patterns without the frameworks (tests/programs/framework_patterns.py):
a nested optimizer container, one optimizer per model part, gradient accumulation with an LR scheduler, a
loss module outside the model, full and selective activation checkpointing (torch.utils.checkpoint + a
SAC policy), compiled blocks, FSDP2 and FSDP2 x TP. For each: the capture's graph counts STEPS iterations
and STEPS x ACCUM microbatches on every rank, by the default rules; the emulated sandbox prints bitwise
what the capture printed; the capture prints what torchrun prints. And collective results are written as
gloo writes them: no version-counter bump after an op returned (tests/programs/result_versions.py)."""

from __future__ import annotations

import sys

import duckdb
import pytest

from tests.conftest import PROGRAMS, capture_graph_emulate, close_lines, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow

sys.path.insert(0, str(PROGRAMS))
from framework_patterns import ACCUM, STEPS  # noqa: E402

PROG = str(PROGRAMS / "framework_patterns.py")
CASES = [  # id, ranks, arguments, sandbox
    ("container-sac", 2, ["--optim", "container", "--ac", "sac"], "1"),
    ("several-full", 2, ["--optim", "several", "--ac", "full"], "0"),
    ("plain-sac-compiled", 2, ["--optim", "plain", "--ac", "sac", "--compile"], "1"),
    ("container-sac-tp", 4, ["--optim", "container", "--ac", "sac", "--tp", "2"], "1,2"),
]


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    return sorted(line for line in lines if ranks is None or int(line.split()[2]) in ranks)


def _markers(job) -> dict[tuple[int, str], int]:
    with duckdb.connect() as con:
        rows = con.execute("SELECT rank, op, count(*) FROM read_parquet(?) WHERE kind = 'marker' GROUP BY ALL",
                           [str(job / "graph" / "events.parquet")]).fetchall()
    return {(r, op): n for r, op, n in rows}


@pytest.mark.parametrize("name, nproc, args, sandbox", CASES, ids=[c[0] for c in CASES])
def test_framework_pattern_counts_its_steps_and_emulates_the_capture(tmp_path, name, nproc, args, sandbox):
    job = tmp_path / "job"
    prog = [PROG, *args]

    (cap, emu), ref = run_together(lambda: capture_graph_emulate(job, nproc, prog, sandbox), lambda: run_torchrun(nproc, prog, timeout=300))
    with duckdb.connect() as con:
        ranks = con.execute("SELECT rank, iterations, iteration_rule, microbatch_rule FROM read_parquet(?) "
                            "ORDER BY rank", [str(job / "graph" / "ranks.parquet")]).fetchall()
    assert [(r, n) for r, n, _, _ in ranks] == [(r, STEPS) for r in range(nproc)]
    assert {(it, mb) for _, _, it, mb in ranks} == {("outermost optimizer step", "forward of a module with trainable "
                                                     "parameters (a pipeline stage's: once per schedule chunk)")}
    markers = _markers(job)
    for rank in range(nproc):
        assert markers[(rank, "iteration_end")] == STEPS
        assert markers[(rank, "fwd_begin")] == markers[(rank, "bwd_end")] == STEPS * ACCUM
        # the inner steps of a container, or the first of several optimizers: not boundaries
        assert markers.get((rank, "optimizer_step"), 0) == (STEPS if "several" in args else 0)
    assert emu.returncode == 0, emu.stderr[-3000:]
    members = {int(r) for r in sandbox.split(",")}
    got = _results(emu.stdout)
    assert got and got == _results(cap.stdout, members)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want, mine = _results(ref.stdout), _results(cap.stdout)
    assert len(want) == len(mine)
    for a, b in zip(mine, want):
        assert close_lines(a, b, 1e-5), (a, b)


def test_collective_results_are_written_as_gloo_writes_them(tmp_path):
    """The version counter of each op's output, right after the call and after its wait: never bumped after
    the call returned (capture and emulate); equal to gloo's where gloo's is not a race (in-place algorithms
    and functional collectives)."""
    prog = [str(PROGRAMS / "result_versions.py")]
    job = tmp_path / "job"

    def capture_emulate():
        cap = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1",
                         "--out", str(job / "capture"), *prog])
        assert cap.returncode == 0, cap.stderr[-3000:]
        return cap, run_prism(["launch", "--nproc", "2", "--mode", "emulate", "--capture", str(job / "capture"),
                               "--sandbox", "1", "--out", str(job / "emu"), *prog])

    (cap, emu), ref = run_together(capture_emulate, lambda: run_torchrun(2, prog))
    assert emu.returncode == 0 and ref.returncode == 0, emu.stderr[-3000:] + ref.stderr[-3000:]
    gloo = {(line.split()[1], line.split()[2]): line.split()[3:] for line in _results(ref.stdout)}
    for proc, ranks in ((cap, {0, 1}), (emu, {1})):
        lines = _results(proc.stdout)
        assert len(lines) == 11 * len(ranks)
        for line in lines:
            _, op, rank, returned, waited, value = line.split()
            assert returned == waited, line  # a bump after the call returned breaks SAC
            assert value == gloo[(op, rank)][2], (line, gloo[(op, rank)])
            if op.startswith(("all_reduce", "broadcast", "fc_all_reduce", "fc_reduce_scatter")):
                assert [returned, waited] == gloo[(op, rank)][:2], (line, gloo[(op, rank)])
