"""Capture mode: W ranks on P slots give the results of plain torchrun, the same graph as a real run,
and a clear diagnosis instead of a hang."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.runtime.launch import run_files
from prism.runtime.launch.launcher import HANG_EXIT
from tests.conftest import REPO, make_env, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow

WORKLOAD = ["-m", "prism.workloads.moe_gpt", "--steps", "2"]
# (the workload's default 3 steps and test_workload_loss's layouts: torchrun's reference runs are shared)
LAYOUTS = {
    "tp2": (2, ["--tp", "2", "--microbatches", "4"]),
    "pp2-mb4": (2, ["--pp", "2", "--microbatches", "4"]),
    "dp2-ep2-varseq": (2, ["--dp", "2", "--ep", "2", "--microbatches", "2", "--var-seq"]),
    "tp2-pp2-dp2-ep2": (8, ["--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--microbatches", "2"]),
}


def losses(text: str) -> list[tuple[int, float]]:
    return sorted({(int(m[1]), float(m[2])) for m in re.finditer(r"^step=(\d+) loss=(\S+)$", text, re.M)})


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory):
    """A layout's captures on P=1 and P=2 slots and its torchrun reference, run at once (independent runs; a
    capture on one slot computes on one core): ({devices: CompletedProcess}, torchrun's)."""
    done: dict[str, tuple] = {}

    def get(name: str):
        if name not in done:
            nproc, flags = LAYOUTS[name]
            prog = ["-m", "prism.workloads.moe_gpt", *flags]
            jobs = [tmp_path_factory.mktemp(f"{name}-p{devices}") / "job" for devices in (1, 2)]
            *caps, ref = run_together(
                *(lambda devices=devices, job=job: run_prism(["launch", "--nproc", str(nproc), "--mode", "capture",
                                                              "--devices", str(devices), "--out", str(job), *prog])
                  for devices, job in zip((1, 2), jobs)),
                lambda: run_torchrun(nproc, prog))  # once per session (test_workload_loss runs the same)
            done[name] = dict(zip((1, 2), caps)), ref
        return done[name]
    return get


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_capture_prints_what_torchrun_prints(layout_runs, name, devices):
    caps, ref = layout_runs(name)
    assert ref.returncode == 0, ref.stderr
    proc = caps[devices]
    assert proc.returncode == 0, proc.stderr
    got, want = losses(proc.stdout), losses(ref.stdout)
    assert len(got) == 3 and [s for s, _ in got] == [s for s, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a == pytest.approx(b, rel=1e-6)


def _comm_sequence(job: Path) -> dict[int, list[tuple]]:
    ev = pq.read_table(job / "graph" / "events.parquet").to_pylist()
    groups = {g["group_name"]: (g["group_desc"], tuple(g["members"]))
              for g in pq.read_table(job / "graph" / "groups.parquet").to_pylist()}
    per_rank: dict[int, list[tuple]] = {}
    for e in ev:
        if e["kind"] == "compute":
            continue
        per_rank.setdefault(e["rank"], []).append((
            e["kind"], e["op"], groups.get(e["group_name"]), e["group_seq"], e["peer"], e["tag"], e["bytes"],
            e["dtype"], e["shape"], e["is_async"], e["iteration"], e["microbatch"]))
    return per_rank


def _matching(job: Path) -> list[tuple]:
    comms = pq.read_table(job / "graph" / "comms.parquet").to_pylist()
    return sorted((c["kind"], c["op"], c["group_seq"], c["src"], c["dst"], tuple(c["members"]), c["bytes"])
                  for c in comms)


def test_bare_graph_equals_the_real_graph(tmp_path):
    flags = WORKLOAD + ["--tp", "2", "--pp", "2", "--dp", "1", "--microbatches", "4"]
    real, cap = tmp_path / "real", tmp_path / "capture"
    ran, proc = run_together(lambda: run_prism(["launch", "--nproc", "4", "--out", str(real), *flags]),
                             lambda: run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "1",
                                                "--out", str(cap), *flags]))
    assert ran.returncode == 0, ran.stderr
    assert proc.returncode == 0, proc.stderr
    for g in run_together(*(lambda job=job: run_prism(["graph", "--job", str(job)]) for job in (real, cap))):
        assert g.returncode == 0, g.stderr
    assert _comm_sequence(real) == _comm_sequence(cap)
    assert _matching(real) == _matching(cap)
    ranks_real = pq.read_table(real / "graph" / "ranks.parquet").to_pylist()
    ranks_cap = pq.read_table(cap / "graph" / "ranks.parquet").to_pylist()
    strip = lambda rows: [(r["rank"], r["tp"], r["pp"], r["dp"], r["ep"]) for r in rows]
    assert strip(ranks_real) == strip(ranks_cap)
    assert {(r["tp"], r["pp"]) for r in ranks_cap} == {(0, 0), (1, 0), (0, 1), (1, 1)}


def test_at_most_p_ranks_compute_at_once_and_payloads_are_kept(tmp_path):
    job = tmp_path / "job"
    shm_before = set(Path("/dev/shm").glob("prism-*"))
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out", str(job),
                      *WORKLOAD, "--dp", "4", "--ep", "2"])
    assert proc.returncode == 0, proc.stderr
    intervals = []
    for rank in range(4):
        with pa.ipc.open_stream(str(job / "raw" / f"rank={rank}" / "events.arrow")) as r:
            ev = r.read_all().to_pylist()
        # a compute span runs while the rank holds a slot (waiting happens inside wait events)
        intervals += [(e["t_start_ns"], e["t_end_ns"]) for e in ev if e["kind"] == "compute"
                      and e["t_end_ns"] > e["t_start_ns"]]
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda p: (p[0], p[1]))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    assert peak <= 2, f"{peak} ranks computed at once with 2 slots"

    import json
    meta = json.loads((job / "raw" / "meta.json").read_text())
    assert meta["mode"] == "capture" and meta["devices"] == 2
    assert meta["capture"]["context_switches"] > 0 and meta["capture"]["completed_comms"] > 0
    index = []
    for rank in range(4):
        with pa.ipc.open_stream(str(job / "raw" / f"rank={rank}" / "payloads.arrow")) as r:
            index += r.read_all().to_pylist()
    assert index and all((job / "payloads" / row["hash"][:2] / f"{row['hash']}.bin").is_file() for row in index)
    files = list((job / "payloads").rglob("*.bin"))
    assert len(files) == len({row["hash"] for row in index}) <= len(index)
    # (the launcher's pid is in the name: other sessions' live runs on this machine are not this one's leftovers)
    new = set(Path("/dev/shm").glob("prism-*")) - shm_before
    left = [p for p in new if (m := run_files.TEMP_NAME.match(p.name)) and not run_files.pid_alive(int(m.group(1)))]
    assert not left, f"shared-memory files left behind: {left}"


def test_no_payloads_flag(tmp_path):
    job = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--no-payloads", "--out", str(job),
                      *WORKLOAD, "--dp", "2"])
    assert proc.returncode == 0, proc.stderr
    assert (job / "raw" / "meta.json").is_file() and not (job / "payloads").exists()


HANGS = {
    "rank_exits_early": ("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        r = dist.get_rank()
        for step in range(3 if r != 2 else 2):
            dist.all_reduce(torch.ones(4))
    """, ["all_reduce #2 on default_pg[0,1,2,3]: ranks 0-1,3 arrived with float32[4]; rank 2 has exited (code 0)"]),
    "skipped_collective": ("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        r = dist.get_rank()
        dist.all_reduce(torch.ones(4))
        if r != 3:
            dist.all_reduce(torch.ones(1024))      # rank 3 skips this one ...
        dist.broadcast(torch.ones(16), src=0)      # ... and is already here
    """, ["collective mismatch at all_reduce #1 on default_pg[0,1,2,3]",
          "ranks 0-2 arrived with all_reduce float32[1024]; rank 3 arrived with broadcast float32[16]"]),
    "different_sizes": ("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        r = dist.get_rank()
        dist.all_reduce(torch.ones(8 if r == 1 else 4))
    """, ["collective mismatch at all_reduce #0 on default_pg[0,1,2,3] (sizes differ): ranks 0,2-3 arrived "
          "with float32[4]; rank 1 arrived with float32[8]"]),
    "recv_never_sent": ("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            dist.recv(torch.zeros(2), 0, tag=3)
    """, ["message #0 from rank 0 to rank 1 (tag 3)", "rank 0 has exited (code 0)"]),
}


@pytest.mark.parametrize("name", list(HANGS))
def test_hang_is_diagnosed_not_waited_out(tmp_path, name):
    source, words = HANGS[name]
    prog = tmp_path / f"hang_{name}_{os.getpid()}.py"
    prog.write_text(textwrap.dedent(source))
    start = time.monotonic()
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out",
                      str(tmp_path / "job"), str(prog)], timeout=60)
    assert proc.returncode == HANG_EXIT, proc.stderr
    assert time.monotonic() - start < 30
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)
    assert not (tmp_path / "job" / "raw").exists() and not (tmp_path / "job" / "payloads").exists()
    assert not list((tmp_path / "job").glob(".*tmp*"))
    left = subprocess.run(["pgrep", "-f", prog.name], capture_output=True, text=True).stdout.split()
    assert not left


def test_crash_in_capture_reports_the_rank(tmp_path):
    prog = tmp_path / f"crash_capture_{os.getpid()}.py"
    prog.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise KeyError("capture crash on rank one")
        dist.all_reduce(torch.ones(2))
    """))
    proc = run_prism(["launch", "--nproc", "3", "--mode", "capture", "--devices", "1", str(prog)], timeout=60)
    assert proc.returncode == 1
    assert "rank 1 failed" in proc.stderr and "capture crash on rank one" in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--nproc", "4", "--mode", "capture", "--devices", "0"], "--devices 0 is not possible"),
    (["--nproc", "4", "--mode", "capture", "--devices", "999"], "--devices 999 is not possible"),
    (["--nproc", "1", "--mode", "capture"], "capture needs at least 2 ranks"),
])
def test_capture_bad_input(args, words):
    proc = run_prism(["launch", *args, *WORKLOAD])
    assert proc.returncode == 2 and words in proc.stderr


def test_sigint_during_capture_leaves_nothing(tmp_path):
    prog = tmp_path / f"sigint_capture_{os.getpid()}.py"
    prog.write_text(textwrap.dedent("""
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        print("in", flush=True)
        for _ in range(10000):
            dist.all_reduce(torch.ones(2)); time.sleep(0.01)
    """))
    job = tmp_path / "job"
    launcher = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "3", "--mode",
                                 "capture", "--devices", "1", "--out", str(job), str(prog)], cwd=REPO,
                                env=make_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "in"
    time.sleep(0.5)
    launcher.send_signal(2)
    try:
        launcher.wait(timeout=20)
    finally:
        launcher.kill()
    assert launcher.returncode != 0
    time.sleep(0.5)
    assert not subprocess.run(["pgrep", "-f", prog.name], capture_output=True, text=True).stdout.split()
    assert not (job / "raw").exists() and not list(job.glob(".*tmp*"))
