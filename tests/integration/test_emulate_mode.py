"""Mode emulate: the sandbox ranks run the real program while one replay worker stands in for every other rank.

(a) An unchanged program prints, on the sandbox ranks, bitwise what those ranks printed in the capture (and
within 1e-5 of plain torchrun); (b) a changed contribution reaches the result: the sandbox's all-reduce is
prism's fold of its live contribution with the virtual ranks' recorded ones, not the capture's result.
"""

from __future__ import annotations

import hashlib
import json
import re

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import torch

from prism.runtime import semantics, shm
from tests.conftest import PROGRAMS, close_lines, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow


def _capture(job, nproc: int, program: list[str], devices: int = 1):
    proc = run_prism(["launch", "--nproc", str(nproc), "--mode", "capture", "--devices", str(devices),
                      "--out", str(job / "capture"), *program])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _emulate(job, nproc: int, sandbox: str, program: list[str], *extra: str, out: str = "emu"):
    return run_prism(["launch", "--nproc", str(nproc), "--mode", "emulate", "--capture", str(job / "capture"),
                      "--sandbox", sandbox, *extra, "--out", str(job / out), *program])


def _results(text: str, ranks=None) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith("result ")]
    if ranks is not None:
        lines = [line for line in lines if int(line.split()[2]) in ranks]
    return sorted(lines)


def _meta(job, out: str = "emu") -> dict:
    return json.loads((job / out / "raw" / "meta.json").read_text())


@pytest.fixture(scope="module")
def order_job(reduction_order_capture):
    """reduction_order.py (groups of 4: every summation order rounds differently) captured at W=4 (one
    capture for the session: tests/integration/conftest.py)."""
    return reduction_order_capture


def test_unchanged_program_repeats_the_capture_bitwise(order_job):
    """Sandbox {1} alone and {0, 2} together (two runs of virtual members, a rank-0 root): each collective
    output's hash equals the capture's for the same rank, though the virtual ranks only exist as replay."""
    job, cap = order_job
    prog = [str(PROGRAMS / "reduction_order.py")]
    runs = (("1", "emu1"), ("0,2", "emu02"))  # two emulations of one capture, at once (each its own OUT)
    procs = run_together(*(lambda sandbox=sandbox, out=out: _emulate(job, 4, sandbox, prog, "--devices", "1", out=out)
                           for sandbox, out in runs))
    for (sandbox, out), proc in zip(runs, procs):
        ranks = {int(r) for r in sandbox.split(",")}
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = _results(proc.stdout)
        assert got == _results(cap.stdout, ranks) and len(got) >= 5 * len(ranks)
        meta = _meta(job, out)
        assert meta["mode"] == "emulate" and meta["sandbox"] == sorted(ranks)
        emu = meta["emulation"]
        assert emu["pruning"] and emu["collectives_replayed"] == 6 and emu["bytes_moved"] > 0
        # one group (the world): one compensator per run of virtual ranks in the worker
        assert emu["worker_communicators"] == 2  # [0] 1 [2 3] and 0 [1] 2 [3]: two runs each
        assert emu["communicators"] == 2 + len(ranks)
        assert emu["bytes_moved"] == _protocol_bytes(job, sandbox)
        pool = emu["prefetch"]  # default pool: every payload the worker sends went through it, within capacity
        assert pool["prefetch_mb"] == 256 and pool["loaded"] + pool["direct"] == 6 * (4 - len(ranks))
        assert 0 < pool["peak_bytes"] <= pool["capacity_bytes"]
        assert sorted(p.name for p in (job / out / "raw").iterdir()) == ["meta.json"] + [f"rank={r}" for r in sorted(ranks)]
        assert sorted(p.name for p in (job / out / "logs").iterdir()) == [f"rank={r}.log" for r in sorted(ranks)]
        assert _results((job / out / "logs" / f"rank={min(ranks)}.log").read_text()) == \
            _results(cap.stdout, {min(ranks)})


def _protocol_bytes(job, sandbox: str) -> int:
    """The tensor bytes the pruned protocol moves for reduction_order.py at W=4 (hand-counted; f32, 4096
    elements = 16384 B, a reduce_scatter chunk 4096 B, the last all_gather n elements per member).
    Sandbox 1: participants 0 -> 1 -> [2 3]: each all_reduce 3 tensors (0->1, 1->[2 3], result back),
    each reduce_scatter 3 chunks of rank 1, the reduce to virtual rank 0 nothing, the all_gather 3 members'
    n floats. (Without pruning, 0 -> 1 and 2, 3 send their parts to 1: the same bytes.)
    Sandbox 0,2: 0 -> [1] -> 2 <- [3] (the trailing single member sends its part), result 2 -> 0: each
    all_reduce and the reduce to 0 4 tensors, each reduce_scatter three stacks of the 2 sandbox chunks
    and rank 0's chunk, the all_gather 3 members' n floats to each of the two."""
    ev = _stream(job / "capture" / "raw" / "rank=1" / "events.arrow")
    n = next(r["bytes"] for r in ev if r["op"] == "all_gather") // 4
    if sandbox == "1":
        return 2 * 3 * 16384 + 2 * 3 * 4096 + 0 + 3 * n * 4
    assert sandbox == "0,2"
    return 2 * 4 * 16384 + 2 * (3 * 8192 + 4096) + 4 * 16384 + 2 * 3 * n * 4


def test_no_pruning_gives_the_same_results_with_more_peers(order_job):
    """Also with prefetch off: every payload load is a stall (18: 6 collectives x 3 virtual ranks)."""
    job, cap = order_job
    proc = _emulate(job, 4, "1", [str(PROGRAMS / "reduction_order.py")], "--no-pruning", "--prefetch-mb", "0",
                    out="emu_np")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == _results(cap.stdout, {1})
    emu = _meta(job, "emu_np")["emulation"]
    assert not emu["pruning"] and emu["worker_communicators"] == 3  # ranks 0, 2, 3 each their own peer
    assert emu["bytes_moved"] == _protocol_bytes(job, "1")  # here the same bytes: see _protocol_bytes
    assert emu["prefetch"]["stalls"] == emu["prefetch"]["direct"] == 18 and emu["prefetch"]["peak_bytes"] == 0


def _recorded(job, rank: int, nth: int) -> torch.Tensor:
    """Rank's recorded contribution to its `nth` collective (program order) in the capture."""
    with pa.OSFile(str(job / "capture" / "raw" / f"rank={rank}" / "payloads.arrow")) as f:
        rows = ipc.open_stream(f).read_all().to_pylist()
    ins = sorted((r["work_id"], r["hash"]) for r in rows if r["role"] == "in")
    _, tensors = shm.PayloadStore(job / "capture" / "payloads").get(ins[nth][1])
    return tensors[0]


@pytest.fixture(scope="module")
def scaled_job(tmp_path_factory):
    """scaled_contribution.py, unchanged, captured at W=4 (the emulations change it, each into its own OUT)."""
    job = tmp_path_factory.mktemp("scaled") / "job"
    return job, _capture(job, 4, [str(PROGRAMS / "scaled_contribution.py")])


def test_changed_contribution_is_folded_live(scaled_job):
    """(b) Rank 2 triples its contribution at step 1 (the capture ran the unchanged program): its step-1
    sum is semantics.reduce over [recorded 0, recorded 1, live 2, recorded 3], bitwise; steps 0 and 2 are
    the capture's. Slice mode would print the capture's step-1 sum instead."""
    import sys

    sys.path.insert(0, str(PROGRAMS))
    from scaled_contribution import contribution

    job, cap = scaled_job
    prog = [str(PROGRAMS / "scaled_contribution.py")]
    proc = _emulate(job, 4, "2", prog + ["--scale-rank", "2", "--scale", "3.0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {line.split()[1]: line.split()[3] for line in _results(proc.stdout)}
    want = {line.split()[1]: line.split()[3] for line in _results(cap.stdout, {2})}
    assert got["step=0"] == want["step=0"] and got["step=2"] == want["step=2"]
    live = contribution(2, 1) * 3.0
    assert torch.equal(_recorded(job, 2, 1) * 3.0, live)  # the capture recorded the unscaled value
    parts = [_recorded(job, 0, 1), _recorded(job, 1, 1), live, _recorded(job, 3, 1)]
    expected = semantics.reduce(parts, semantics.RedOp.SUM)
    assert got["step=1"] == hashlib.sha256(expected.numpy().tobytes()).hexdigest()[:16]
    assert got["step=1"] != want["step=1"]


PUBLIC_API = [  # program, arguments, sandbox
    ("ddp", [], "1,2"),  # bucketed gradient all-reduces through futures; two sandbox members in one chain
    ("fsdp2", [], "0,3"),  # all_gather_into_tensor / reduce_scatter_tensor (coalesced), both ends of the ring
    ("dtensor_tp", [], "1"),  # DTensor redistributions: all_reduce, all_gather_into_tensor
    ("pipelining", ["--schedule", "both"], "3"),  # the last stage: p2p with a virtual stage, the losses
    ("alltoall", [], "0"),  # uneven all_to_all_single, every collective async, recv from any source of 3
]


@pytest.mark.parametrize("name, args, sandbox", PUBLIC_API, ids=[c[0] for c in PUBLIC_API])
def test_public_api_program_repeats_the_capture(tmp_path, name, args, sandbox):
    """(a) for the public-API programs at W=4: the sandbox ranks print, bitwise, what they printed in the
    capture (losses, gradient norms, parameters' checksums, collective outputs), and within 1e-5 relative
    what the same ranks print under plain torchrun (gloo's reduction order differs from prism's)."""
    job = tmp_path / "job"
    prog = [str(PROGRAMS / f"{name}.py"), *args]
    (cap, proc), ref = run_together(lambda: (_capture(job, 4, prog, devices=2), _emulate(job, 4, sandbox, prog)),
                                    lambda: run_torchrun(4, prog))  # independent: at once
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = {int(r) for r in sandbox.split(",")}
    got = _results(proc.stdout)
    assert got == _results(cap.stdout, ranks) and got
    assert {int(line.split()[2]) for line in got} == ranks  # every sandbox rank printed
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = _results(ref.stdout, ranks)
    assert len(want) == len(got)
    for a, b in zip(got, want):
        assert close_lines(a, b, 1e-5), (a, b)


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


STEP = re.compile(r"step=(\d+) (loss|grad_norm)=(\S+)")


def _steps(text: str) -> list[tuple[int, str, float]]:
    return sorted((int(m[1]), m[2], float(m[3])) for m in STEP.finditer(text))


LAYOUTS = [  # nproc, workload arguments, the sandbox (ranks that print the loss are tp 0 on the last stage)
    (4, ["--tp", "2", "--dp", "2", "--ep", "2"], "0"),
    (4, ["--pp", "2", "--dp", "2", "--microbatches", "4", "--var-seq"], "2"),
    (4, ["--tp", "2", "--dp", "2", "--ep", "2"], "0,1"),  # the TP group all sandbox: native ops (native_group)
]


@pytest.mark.parametrize("nproc, args, sandbox", LAYOUTS,
                         ids=["tp2-dp2-ep2", "pp2-dp2-mb4-varseq", "tp2-dp2-ep2-sandbox01"])
def test_workload_sandbox_prints_the_capture_losses(workload_captures, nproc, args, sandbox):
    """One capture per layout (tests/integration/conftest.py: the tp2-dp2-ep2 one is test_slice_mode's too),
    shared by the sandboxes emulated against it (each its own OUT)."""
    prog = ["-m", "prism.workloads.moe_gpt", *args, "--steps", "2"]
    out = "emu" + sandbox.replace(",", "_")

    def capture_and_emulate():
        job, cap = workload_captures(nproc, prog)
        return job, cap, _emulate(job, nproc, sandbox, prog, out=out)

    (job, cap, proc), ref = run_together(capture_and_emulate, lambda: run_torchrun(nproc, prog))  # independent
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _steps(proc.stdout + proc.stderr)
    want = sorted(set(_steps(cap.stdout + cap.stderr)))  # every printing rank prints the same line
    assert len(got) == 4 and got == want  # two steps, loss and grad_norm, as printed (bitwise text)
    # every payload the worker used was in the prefetch schedule (p2p from and to the sandbox included):
    # none loaded out of band (a stall whatever the pool's size)
    prefetch = _meta(job, out)["emulation"]["prefetch"]
    assert prefetch["direct"] == 0 and prefetch["loaded"] > 0, prefetch
    assert ref.returncode == 0, ref.stderr[-3000:]
    for (s, what, x), (s2, what2, y) in zip(got, sorted(set(_steps(ref.stdout + ref.stderr)))):
        assert (s, what) == (s2, what2) and _close(x, y), (s, what, x, y)


def test_a_crashing_or_diverging_sandbox_rank_stops_the_worker_and_writes_nothing(scaled_job):
    """Rank 2 raises at step 1 (after its step-0 all_reduce with the worker): the run stops with its
    traceback named, the worker is stopped too, and nothing is published under OUT."""
    import time

    scaled, _ = scaled_job
    started = time.monotonic()
    proc = _emulate(scaled, 4, "2", [str(PROGRAMS / "scaled_contribution.py"), "--crash-rank", "2"], out="crash")
    assert proc.returncode != 0
    assert "rank 2 failed" in proc.stderr and "deliberate crash at step 1" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - started < 120
    out = scaled / "crash"
    assert not (out / "raw").exists() and not (out / "logs").exists()
    assert not out.exists() or not [p for p in out.iterdir() if p.name.startswith(".")]  # a failed run removes
    # the --out folder it created
    # a sandbox whose communication departs in size (rank 2's step-1 all_reduce twice as long): stopped
    # before the op reaches the worker, naming the rank, the op here and in the capture with their sequence
    # numbers (program-order index, group_seq, capture seq) and both sizes
    started = time.monotonic()
    proc = _emulate(scaled, 4, "2", [str(PROGRAMS / "scaled_contribution.py"), "--grow-rank", "2"], out="grown")
    assert proc.returncode != 0
    assert re.search(r"prism emulate: rank 2 diverged from its capture: its op #1 \(seq \d+ in the capture\) is "
                     r"\[kind=collective, op=all_reduce, group_name=0, group_seq=1, peer=-1, tag=0, bytes=8192\] "
                     r"here but \[kind=collective, op=all_reduce, group_name=0, group_seq=1, peer=-1, tag=0, "
                     r"bytes=4096\] in the capture", proc.stderr), proc.stderr[-3000:]
    assert time.monotonic() - started < 120
    assert not (scaled / "grown").exists()


def test_bad_sandbox_and_divergence_are_named_and_write_nothing(order_job, tmp_path):
    job, _ = order_job
    prog = [str(PROGRAMS / "reduction_order.py")]
    proc = _emulate(job, 4, "4", prog, out="bad")
    assert proc.returncode == 2 and "--sandbox [4] outside 0..3" in proc.stderr
    assert not (job / "bad" / "raw").exists()
    # another program against this capture: the first differing op is named with both sides
    proc = _emulate(job, 4, "1", [str(PROGRAMS / "scaled_contribution.py")], out="diverged")
    assert proc.returncode != 0
    assert re.search(r"rank 1 diverged from its capture: its op #\d+ \(seq \d+ in the capture\)", proc.stderr), \
        proc.stderr[-3000:]
    assert not (job / "diverged" / "raw").exists() and not (job / "diverged" / "logs").exists()
    assert not (job / "diverged").exists()  # a failed run removes the --out folder it created


def _stream(path) -> list[dict]:
    with pa.OSFile(str(path)) as f:
        return ipc.open_stream(f).read_all().to_pylist()


def test_timed_replay_a_slow_virtual_rank_delays_the_sandbox(order_job):
    """With a calibrated timeline (written here: the capture's own times back to back, rank 3's first compute
    event 1.5 s longer), the sandbox ranks and the worker start from one t0 (the common start barrier) and
    the worker holds every real op to the virtual ranks' clock: the sandbox's first all_reduce completes only
    after rank 3 arrives (t0 + 1.5 s). The virtual events between two real ops (the cone) are replayed live,
    on the same clock, after the real op they depend on."""
    import pyarrow.parquet as pq

    from prism import schemas

    job, cap = order_job
    graph = run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")])
    assert graph.returncode == 0, graph.stderr[-3000:]
    events = pq.read_table(job / "graph" / "events.parquet").to_pylist()
    slow, rows, clock = 1_500_000_000, [], {}
    for r in sorted(events, key=lambda r: (r["rank"], r["seq"])):  # the sweep's layout: each rank from 0
        start = clock.get(r["rank"], 0)
        length = r["t_end_ns"] - r["t_start_ns"] + (slow if r["rank"] == 3 and r["seq"] == 0 else 0)
        rows.append(dict(rank=r["rank"], seq=r["seq"], event_id=r["event_id"], start_ns=start, end_ns=start + length))
        clock[r["rank"]] = start + length
    assert events[0]["kind"] == "compute"  # (rank 3's seq 0 is its first compute event)
    arrive3 = next(t["start_ns"] for t, e in zip(rows, sorted(events, key=lambda r: (r["rank"], r["seq"])))
                   if e["rank"] == 3 and e["kind"] == "collective")
    assert arrive3 >= slow
    (job / "calibrated").mkdir()
    try:
        pq.write_table(pa.Table.from_pylist(rows, schema=schemas.TIMELINE), job / "calibrated" / "timeline.parquet")
        proc = _emulate(job, 4, "1", [str(PROGRAMS / "reduction_order.py")], out="timed")
    finally:
        (job / "calibrated" / "timeline.parquet").unlink()
        (job / "calibrated").rmdir()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == _results(cap.stdout, {1})  # the values do not depend on the timing
    meta = _meta(job, "timed")
    t0 = meta["t0_ns"]
    assert meta["emulation"]["timed"]
    cone = meta["emulation"]["cone"]
    assert 0 < cone["cone_live_events"] < cone["virtual_events"] and cone["real_comms_gated"] > 0
    assert cone["gate_late_max_ms"] < 1000  # the clock itself held no op (a kernel compiled after t0 did, 7 s)
    sandbox = _stream(job / "timed" / "raw" / "rank=1" / "events.arrow")
    assert sandbox[0]["t_start_ns"] == t0  # the sandbox's timeline starts at the common start
    first_wait = next(r for r in sandbox if r["kind"] == "wait")
    assert first_wait["t_end_ns"] - t0 >= arrive3  # it waited for the slow virtual rank
    replayed = _stream(job / "timed" / "raw" / "replay" / "events.arrow")
    assert replayed and {r["rank"] for r in replayed} <= {0, 2, 3}
    # on the same clock: the live events end after the first real op, which completed after rank 3 arrived
    # (each virtual rank's first live event is its wait on that op, which starts at its calibrated time)
    assert min(r["t_end_ns"] for r in replayed) - t0 >= arrive3
    firsts = [min((r for r in replayed if r["rank"] == v), key=lambda r: r["seq"])
              for v in {r["rank"] for r in replayed}]
    assert all(r["kind"] == "wait" for r in firsts), firsts
    assert all(r["t_start_ns"] - t0 < arrive3 for r in firsts if r["rank"] != 3), firsts
    calibrated = {(t["rank"], t["seq"]): t["start_ns"] for t in rows}  # each at its calibrated time, from t0
    assert all(r["t_start_ns"] - t0 == calibrated[(r["rank"], r["seq"])] for r in firsts), firsts
    assert "[prism] emulation: iteration 0 emulated (1/1)" in proc.stderr
