"""`prism launch`: real multi-process runs on gloo — the trace it records, failures, bad input, signals."""

from __future__ import annotations

import json
import os
import shutil
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from prism.runtime.launch import run_files
from tests.conftest import REPO, make_env, run_prism

pytestmark = pytest.mark.slow

TRACE_PROGRAM = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
r, w = dist.get_rank(), dist.get_world_size()
pairs = dist.new_group([0, 1], group_desc="tp")
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(4, 8) * (r + 1)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)                              # sync, default group
    t = torch.full((16,), float(r))
    work = dist.all_reduce(t, group=pairs, async_op=True)   # async: compute runs before the wait
    busy = torch.randn(64, 64) @ torch.randn(64, 64)
    work.wait()
    if r == 0:
        dist.send(torch.arange(5.0), 1, tag=7)
    elif r == 1:
        buf = torch.zeros(5); dist.recv(buf, 0, tag=7)
    opt.step(); opt.zero_grad()
print(f"rank={r} world={w} local={os.environ['LOCAL_RANK']} threads={torch.get_num_threads()} "
      f"cores={sorted(os.sched_getaffinity(0))} sum={t.sum().item():.1f}", flush=True)
"""


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def read_stream(path: Path) -> pa.Table:
    with pa.ipc.open_stream(str(path)) as reader:
        return reader.read_all()


def no_process_runs(marker: str) -> bool:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return not [pid for pid in out if int(pid) != os.getpid()]


def test_trace_of_a_real_run(tmp_path):
    prog = write(tmp_path, "trace_prog.py", TRACE_PROGRAM)
    out = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "2", "--pin", "--out", str(out), str(prog)])
    assert proc.returncode == 0, proc.stderr
    lines = sorted(l for l in proc.stdout.splitlines() if l.startswith("rank="))
    assert len(lines) == 2
    assert "rank=0 world=2 local=0 threads=1" in lines[0] and "sum=16.0" in lines[0]
    meta = json.loads((out / "raw" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["mode"] == "real" and meta["pin"] is True
    assert not list(out.glob(".raw.tmp-*")), "staging folder left behind"

    for rank in (0, 1):
        ev = read_stream(out / "raw" / f"rank={rank}" / "events.arrow").to_pylist()
        assert [e["seq"] for e in ev] == list(range(len(ev)))
        assert all(e["rank"] == rank for e in ev)
        groups = read_stream(out / "raw" / f"rank={rank}" / "groups.arrow").to_pylist()
        by_desc = {g["group_desc"]: g for g in groups}
        assert by_desc["tp"]["members"] == [0, 1] and by_desc["default_pg"]["members"] == [0, 1]
        tp_name = by_desc["tp"]["group_name"]

        coll = [e for e in ev if e["kind"] == "collective"]
        default = [e for e in coll if e["group_name"] != tp_name]
        tp = [e for e in coll if e["group_name"] == tp_name]
        # DDP-free program: 2 parameter all-reduces per step on the default group, 1 on tp
        assert [e["op"] for e in default] == ["all_reduce"] * 6
        assert [e["group_seq"] for e in default] == list(range(6))
        assert [e["group_seq"] for e in tp] == [0, 1, 2]
        assert all(not e["is_async"] for e in default), "blocking all_reduce recorded as async"
        assert all(e["is_async"] for e in tp), "async all_reduce waited later recorded as sync"
        assert tp[0]["bytes"] == 64 and tp[0]["dtype"] == "float32" and tp[0]["shape"] == "16"
        waits = {e["work_id"] for e in ev if e["kind"] == "wait"}
        assert all(e["work_id"] in waits for e in coll), "every waited op has its wait event"
        assert all(e["t_complete_ns"] >= e["t_start_ns"] for e in tp)

        p2p = [e for e in ev if e["kind"] in ("send", "recv")]
        assert len(p2p) == 3 and all(e["tag"] == 7 and e["peer"] == 1 - rank for e in p2p)
        assert {e["kind"] for e in p2p} == {"send" if rank == 0 else "recv"}

        ends = [e for e in ev if e["op"] == "iteration_end"]
        assert [e["iteration"] for e in ends] == [0, 1, 2]
        assert [e["op"] for e in ev if e["kind"] == "marker"][:4] == ["fwd_begin", "fwd_end", "bwd_begin",
                                                                       "bwd_end"]
        assert all(e["mem_bytes"] > 0 and e["mem_peak_bytes"] >= e["mem_bytes"] for e in ends)
        compute = [e for e in ev if e["kind"] == "compute"]
        assert sum(e["cpu_ns"] for e in compute) > 0
        for a, b in zip(ev, ev[1:]):
            assert a["t_end_ns"] <= b["t_start_ns"], "events of a rank overlap"


def test_rank_failure_stops_the_others(tmp_path):
    prog = write(tmp_path, "fail_prog_unique.py", """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 2:
            time.sleep(0.5)
            raise RuntimeError("deliberate failure on rank two")
        dist.all_reduce(torch.ones(1))   # the others block here until stopped
    """)
    out = tmp_path / "job"
    start = time.monotonic()
    proc = run_prism(["launch", "--nproc", "3", "--out", str(out), str(prog)], timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "rank 2 failed" in proc.stderr
    assert "deliberate failure on rank two" in proc.stderr and "Traceback" in proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f}s to stop the ranks"
    assert not (out / "raw").exists(), "a failed run published a trace"
    assert not list(out.glob(".raw.tmp-*"))
    assert no_process_runs("fail_prog_unique.py")


def test_rank_killed_by_signal(tmp_path):
    prog = write(tmp_path, "killed_prog_unique.py", """
        import os, signal, time, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    proc = run_prism(["launch", "--nproc", "2", str(prog)], timeout=60)
    assert proc.returncode != 0
    assert "rank 1 failed with signal 9 (SIGKILL)" in proc.stderr
    assert no_process_runs("killed_prog_unique.py")


def test_sigterm_to_launcher_leaves_no_process(tmp_path):
    prog = write(tmp_path, "sleepy_prog_unique.py", """
        import time, torch.distributed as dist
        dist.init_process_group("gloo")
        print("started", flush=True)
        time.sleep(120)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "2", "--out",
                                 str(tmp_path / "job"), str(prog)], cwd=REPO, env=make_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "started"
    launcher.send_signal(signal.SIGTERM)
    try:
        launcher.wait(timeout=20)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM, launcher.stderr.read()
    time.sleep(0.5)
    assert no_process_runs("sleepy_prog_unique.py")
    assert not (tmp_path / "job").exists(), "the failed run left its --out folder"


def test_a_ranks_lines_reach_the_launchers_output_as_printed(tmp_path):
    """A rank prints without flushing, then waits for the test to have read that line: block-buffered, the line
    would leave the rank only at exit, and the rank would give up waiting (exit 1)."""
    seen = tmp_path / "seen"
    prog = write(tmp_path, "chatty_prog_unique.py", f"""
        import os, sys, time, torch.distributed as dist
        dist.init_process_group("gloo")
        print("line", dist.get_rank())
        deadline = time.monotonic() + 60
        while not os.path.exists({str(seen)!r}):
            if time.monotonic() > deadline:
                sys.exit("the line never reached the launcher's output")
            time.sleep(0.05)
    """)
    env = make_env()
    env.pop("PYTHONUNBUFFERED")  # as under Snakemake's `>> log`: Python's own default for a pipe
    launcher = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "2", "--out",
                                 str(tmp_path / "job"), str(prog)], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline().startswith("line ")
        seen.touch()
        out, err = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err


def leftovers_of(pid: int) -> list[Path]:
    return [p for root in {Path(run_files.SHM_ROOT), Path(tempfile.gettempdir())} for p in root.glob(f"prism-{pid}-*")]


def test_sigterm_during_capture_removes_every_temporary_and_dead_runs_are_swept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    planted = {
        Path(run_files.SHM_ROOT) / f"prism-{dead.pid}-0123abcd": False,           # swept: its launcher is dead
        Path(tempfile.gettempdir()) / f"prism-{dead.pid}-0123abcd-x1y2": False,
        Path(run_files.SHM_ROOT) / f"prism-{live.pid}-0123abcd": True,            # kept: a live launcher's
    }
    prog = write(tmp_path, "sigterm_capture_unique.py", """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        print("in", flush=True)
        for _ in range(10000):
            dist.all_reduce(torch.ones(2)); time.sleep(0.01)
    """)
    job = tmp_path / "job"
    try:
        for path in planted:
            (path / "sub").mkdir(parents=True)
        launcher = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "3", "--mode",
                                     "capture", "--devices", "1", "--out", str(job), str(prog)], cwd=REPO,
                                    env=make_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert launcher.stdout.readline().strip() == "in"
        assert leftovers_of(launcher.pid), "the capture's temporaries are not named by the launcher's pid"
        assert list(job.glob(".raw.tmp-*")) and list(job.glob(".payloads.tmp-*"))
        for path, kept in planted.items():
            assert path.exists() == kept, path
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=30)
        finally:
            launcher.kill()
        err = launcher.stderr.read()
        assert launcher.returncode == 128 + signal.SIGTERM, err
        assert "launcher got signal 15" in err
        time.sleep(0.5)
        assert no_process_runs(prog.name)
        assert not leftovers_of(launcher.pid)
        assert not job.exists(), "the stopped run left its --out folder"
    finally:
        live.kill()
        live.wait()
        for path in planted:
            shutil.rmtree(path, ignore_errors=True)


def test_out_holds_one_run(tmp_path):
    prog = write(tmp_path, "tiny_prog.py", """
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()
    """)
    out = tmp_path / "job"
    assert run_prism(["launch", "--nproc", "2", "--out", str(out), str(prog)], timeout=120).returncode == 0
    first = json.loads((out / "raw" / "meta.json").read_text())["run_id"]
    assert len(first) == 32 and int(first, 16) >= 0
    (out / "graph").mkdir()  # a later stage's output of that run
    again = run_prism(["launch", "--nproc", "2", "--out", str(out), str(prog)], timeout=120)
    assert again.returncode == 2 and f"--out {out} is not empty (graph, raw)" in again.stderr
    assert json.loads((out / "raw" / "meta.json").read_text())["run_id"] == first, "the refusal touched raw/"
    forced = run_prism(["launch", "--nproc", "2", "--out", str(out), "--force", str(prog)], timeout=120)
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["raw"]
    assert json.loads((out / "raw" / "meta.json").read_text())["run_id"] != first


def test_bad_layout_is_reported_once_and_writes_nothing(tmp_path):
    out = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "4", "--out", str(out), "-m", "prism.workloads.moe_gpt", "--tp", "3"],
                     timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("moe_gpt: error: WORLD_SIZE=4 is not a multiple of --tp 3") == 1, proc.stderr
    assert proc.stderr.count("[prism] every rank exited with code 2") == 1
    assert "Traceback" not in proc.stderr and "failed with" not in proc.stderr
    assert not out.exists()
    proc = run_prism(["launch", "--nproc", "2", "-m", "prism.workloads.moe_gpt", "--no-such-flag"], timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("unrecognized arguments: --no-such-flag") == 1, proc.stderr


def test_interception_reaches_subprocesses_through_sitecustomize(tmp_path):
    prog = write(tmp_path, "spawn_prog.py", """
        import subprocess, sys
        code = ("import torch.distributed.distributed_c10d as c; "
                "print('child', c._new_process_group_helper.__module__)")
        print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())
    """)
    proc = run_prism(["launch", "--nproc", "1", str(prog)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "child prism.runtime.interception"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc", "2", "no_such_script.py"], "script not found: no_such_script.py"),
        (["--nproc", "2", "-m", "no_such.module"], "module not found: no_such.module"),
        (["--nproc", "0", "x.py"], "--nproc must be at least 1"),
        (["--nproc", "2"], "no program given"),
        (["--nproc", "2", "--out", "/proc/forbidden", "-m", "prism.workloads.moe_gpt"], "not writable"),
        (["--nproc", "2", "--devices", "1", "-m", "prism.workloads.moe_gpt"], "drop --devices"),
        (["--nproc", "2", "--mode", "off", "--progress", "-m", "prism.workloads.moe_gpt"], "--mode off records nothing"),
        (["--nproc", "2", "--out", "/proc/forbidden", "--force", "-m", "prism.workloads.moe_gpt"], "not writable"),
    ],
)
def test_bad_input_exits_2_before_any_rank_starts(tmp_path, args, message):
    start = time.monotonic()
    proc = run_prism(["launch", *args], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 20


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nproc", "3", "-m", "prism.workloads.moe_gpt", "--tp", "2"], "--tp"),
        (["--nproc", "4", "-m", "prism.workloads.moe_gpt", "--dp", "4", "--ep", "3"], "--ep"),
        (["--nproc", "2", "-m", "prism.workloads.moe_gpt", "--tp", "2", "--heads", "3", "--kv-heads", "1"],
         "--heads"),
        (["--nproc", "2", "-m", "prism.workloads.moe_gpt", "--dp", "2", "--ep", "2", "--experts", "3"],
         "--experts"),
    ],
)
def test_the_workload_rejects_its_layout_in_its_ranks(args, message):
    """The layout is the workload's to check (the launcher knows no workload): its ranks start, rank 0 names
    the mistake once, every rank exits 2 before any rendezvous. The bound separates failing fast from waiting
    for a timeout: the zygote's warm imports and the ranks cost ~7 s of CPU."""
    start = time.monotonic()
    proc = run_prism(["launch", *args], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("moe_gpt: error:") == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60


def _on_a_terminal(args: list[str]) -> str:
    """Run `prism launch ARGS` with stderr a terminal (a pty); its stderr as text."""
    import pty
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", *args], cwd=REPO, env=make_env(),
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks: list[bytes] = []

    def read_all():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    try:
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    reader.join(timeout=10)
    os.close(master)
    return b"".join(chunks).decode()


def test_capture_progress_on_a_terminal(tmp_path):
    """stderr a terminal: the capture's progress line is rewritten in place and wiped before rank output."""
    prog = write(tmp_path, "progress_prog_unique.py", """
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        for step in range(30):
            time.sleep(0.1)
            dist.all_reduce(torch.ones(2))
        print(f"rank {dist.get_rank()} finished", file=sys.stderr, flush=True)
    """)
    err = _on_a_terminal(["--nproc", "2", "--mode", "capture", "--devices", "1", str(prog)])
    assert "\r\x1b[K[prism] capture" in err and "ranks done" in err, err
    finished = [line for line in err.replace("\r\n", "\n").split("\n") if "finished" in line]
    assert sorted(line.split("\x1b[K")[-1] for line in finished) == ["rank 0 finished", "rank 1 finished"], err


def test_real_run_progress_counts_iterations_on_a_terminal(tmp_path):
    """A real run (nothing recorded: no --out) shows the iterations its ranks ended (optimizer steps)."""
    prog = write(tmp_path, "iterations_prog_unique.py", """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(8):
            time.sleep(0.4)
            m(torch.ones(2, 4)).sum().backward()
            dist.all_reduce(m.weight.grad)
            opt.step()
    """)
    err = _on_a_terminal(["--nproc", "2", str(prog)])
    counts = [int(m) for m in re.findall(r"\[prism\] real ranks 0,1: (\d+)it ", err)]
    assert counts and max(counts) >= 3 and counts == sorted(counts), err
