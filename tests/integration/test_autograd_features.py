"""Emulate = capture, bitwise, for the autograd features real frameworks put collectives in (issue 21, item 2;
tests/programs/autograd_features.py): DTensor redistribute inside a selective-checkpoint region, functional
collectives with autograd (eager under SAC, and compiled with torch.compile's aot_eager backend), pipelining's
interleaved 1F1B with SAC stages and 1F1B with full AC, FSDP2's reshard_after_forward True / False / 2 with
full AC and SAC blocks. The capture's graph counts, on every rank, each iteration's microbatches by the default
rules: one a forward of the model the rank trains, so interleaved 1F1B's two stages a rank and pipelining's
first-step metadata inference add none, and a section with no module forward has none. The sandbox ranks
print, bitwise, what they printed in the capture, and the capture prints what torchrun prints (within 1e-5 relative: prism's reduction order is not gloo's). Features covered
elsewhere: full AC, SAC with a policy, compiled blocks, FSDP2 x TP (test_framework_patterns.py); GPipe and
1F1B without AC, DTensor TP (test_emulate_mode.py); async TP (test_async_tp.py)."""

from __future__ import annotations

import duckdb
import pytest

from tests.conftest import PROGRAMS, capture_graph_emulate, close_lines, run_together, run_torchrun

pytestmark = pytest.mark.slow

PROG = str(PROGRAMS / "autograd_features.py")
CASES = [  # id, ranks, features, sandbox, the sections the sandbox must print, microbatches of each iteration
    ("redistribute-functional-pipeline", 2, "redistribute,functional,pipeline", "1",
     ["redistribute_loss1", "functional_loss1", "interleaved_loss1", "1f1b_loss1", "1f1b_w"],
     [0, 0, 0, 0, 4, 4, 4, 4]),  # 2 steps each: redistribute, functional, interleaved 1F1B, 1F1B (4 chunks)
    ("reshard", 4, "reshard", "1,2", ["reshard_loss1", "reshard_w"], [2, 2]),
]


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    return sorted(line for line in lines if ranks is None or int(line.split()[2]) in ranks)


def _microbatches(job, nproc: int, iterations: int) -> dict[tuple[int, str], list[int]]:
    """{(rank, marker): its count in each iteration} for the forward and backward markers of the graph."""
    with duckdb.connect() as con:
        rows = con.execute("SELECT rank, op, iteration, count(*) FROM read_parquet(?) WHERE kind = 'marker' "
                           "GROUP BY ALL", [str(job / "graph" / "events.parquet")]).fetchall()
    counts = {(r, op): [0] * iterations for r in range(nproc) for op in ("fwd_begin", "fwd_end", "bwd_end")}
    for rank, op, it, n in rows:
        if (rank, op) in counts:
            counts[(rank, op)][it] = n
    return counts


@pytest.mark.parametrize("name, nproc, features, sandbox, sections, microbatches", CASES,
                         ids=[c[0] for c in CASES])
def test_emulated_sandbox_repeats_the_capture_bitwise(tmp_path, name, nproc, features, sandbox, sections,
                                                      microbatches):
    job = tmp_path / "job"
    prog = [PROG, "--features", features]

    (cap, emu), ref = run_together(lambda: capture_graph_emulate(job, nproc, prog, sandbox), lambda: run_torchrun(nproc, prog, timeout=300))
    assert _microbatches(job, nproc, len(microbatches)) == {
        (r, op): microbatches for r in range(nproc) for op in ("fwd_begin", "fwd_end", "bwd_end")}
    assert emu.returncode == 0, emu.stderr[-3000:]
    members = {int(r) for r in sandbox.split(",")}
    got = _results(emu.stdout)
    assert got == _results(cap.stdout, members)
    printed = {line.split()[1] for line in got}
    assert set(sections) <= printed, printed
    assert {int(line.split()[2]) for line in got} == members
    assert ref.returncode == 0, ref.stderr[-3000:]
    want, mine = _results(ref.stdout), _results(cap.stdout)
    assert len(want) == len(mine)
    for a, b in zip(mine, want):
        assert close_lines(a, b, 1e-5), (a, b)
