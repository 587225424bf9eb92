"""A capture and an emulation spread over hosts: two launchers on this machine ("hosts" 0 and 1 on localhost, W=8
as 2 x 4 ranks on one slot each) give the artifacts of a one-host run of the same job, but for the host columns
(and, for the emulation, times); a host that dies, a rank that fails, a rendezvous that never completes, a host
whose share does not fit it: one error naming the host, every host's ranks stopped, nothing published."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from prism.runtime.launch.launcher import free_port
from tests.conftest import REPO, make_env, run_prism, run_together

pytestmark = pytest.mark.slow

PROG = str(REPO / "tests" / "programs" / "hosts_loop.py")
# the columns that say what a rank did (not when, nor how long)
WHAT = ["rank", "seq", "kind", "op", "group_name", "group_seq", "peer", "tag", "bytes", "dtype", "shape", "is_async",
        "work_id", "iteration", "microbatch", "stream"]
# what the replay worker's real exchanges were, not when (raw/replay/exchanges.arrow, in comm order)
EXCHANGED = ["comm_id", "op", "iteration", "transfer_ns", "calibrated_completion_ns"]


def _launcher(k: int, port: int, out: Path, prog: list[str], nnodes: int = 2, nproc: int = 4, preexec=None,
              mode: tuple[str, ...] = ("--mode", "capture"), **env) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nnodes", str(nnodes), "--node-rank", str(k),
           "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc", str(nproc), "--devices", "1",
           *mode, "--out", str(out), *prog]
    log = open(out.parent / f"host{k}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=make_env(**env),
                            start_new_session=True, preexec_fn=preexec)


def _session_processes(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str]]:
    """Wait for the launchers; (exit code, output) each. On timeout kill every session and fail."""
    end = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise
    out = []
    for p in procs:
        out.append((p.returncode, Path(p.args[p.args.index("--out") + 1]).parent.joinpath(
            f"host{p.args[p.args.index('--node-rank') + 1]}.log").read_text()))
        deadline = time.monotonic() + 10
        while _session_processes(p.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_processes(p.pid), f"processes left behind by host launcher {p.args}"
    return out


def _two_hosts(tmp: Path, prog: list[str], out_name: str = "job", **kw) -> tuple[Path, list[tuple[int, str]]]:
    tmp.mkdir(parents=True, exist_ok=True)
    out, port = tmp / out_name, free_port()
    return out, _finish([_launcher(k, port, out, prog, **kw) for k in (0, 1)])


def _arrow(path: Path) -> pa.Table:
    with pa.OSFile(str(path)) as f:
        return ipc.open_stream(f).read_all()


def _what_ranks_did(job: Path) -> dict:
    """Per rank: its events (what, not when), its payload index (content hashes), its groups."""
    got = {}
    for folder in sorted((job / "raw").glob("rank=*")):
        events = _arrow(folder / "events.arrow").select(WHAT).to_pylist()
        payloads = sorted(tuple(r.values()) for r in _arrow(folder / "payloads.arrow").to_pylist())
        groups = _arrow(folder / "groups.arrow").to_pylist()
        got[folder.name] = (events, payloads, groups)
    return got


MOE = ["-m", "prism.workloads.moe_gpt", "--steps", "2", "--microbatches", "2"]
LAYOUTS = {  # ranks 0-3 on host 0, 4-7 on host 1
    "dp4-tp2-ep4": [*MOE, "--tp", "2", "--dp", "4", "--ep", "4"],  # all-reduce, all-to-all across hosts
    "pp2-tp2-dp2": [*MOE, "--tp", "2", "--pp", "2", "--dp", "2"],  # the pipeline's send/recv across hosts
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """name -> (JOB captured over two hosts, its launchers' (code, output), JOB captured on one host, its
    CompletedProcess); each layout captured once for the module (the emulation tests use dp4-tp2-ep4's)."""
    done = {}

    def get(name: str):
        if name not in done:
            tmp, prog = tmp_path_factory.mktemp(name), LAYOUTS[name]
            one = tmp / "one" / "job"
            (job, results), single = run_together(
                lambda: _two_hosts(tmp / "two", prog),
                lambda: run_prism(["launch", "--nproc", "8", "--devices", "2", "--mode", "capture", "--out", str(one),
                                   *prog], timeout=300))
            done[name] = job, results, one, single
        return done[name]
    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_hosts_capture_equals_one_host(captured, name):
    job, results, one, single = captured(name)
    assert single.returncode == 0, single.stderr
    for code, text in results:
        assert code == 0, text
    assert _what_ranks_did(job) == _what_ranks_did(one)
    # the payloads themselves (content-addressed): the same files, so every value crossed hosts bitwise
    assert sorted(p.name for p in (job / "payloads").rglob("*.bin")) == \
        sorted(p.name for p in (one / "payloads").rglob("*.bin"))
    import json

    meta, meta1 = (json.loads((j / "raw" / "meta.json").read_text()) for j in (job, one))
    assert meta["world_size"] == meta1["world_size"] == 8 and meta["nnodes"] == 2
    assert [h["ranks"] for h in meta["hosts"]] == [[0, 4], [4, 8]]
    assert meta["capture"]["bridge"]["frames_out"] > 0
    # the host columns: the graph's ranks.node says which host ran each rank
    graph = subprocess.run([sys.executable, "-m", "prism.graph", "--job", str(job)], capture_output=True, text=True,
                           cwd=REPO, env=make_env(), timeout=240)
    assert graph.returncode == 0, graph.stderr
    nodes = pq.read_table(job / "graph" / "ranks.parquet").to_pydict()
    names = dict(zip(nodes["rank"], nodes["node"]))
    assert len({names[r] for r in range(4)}) == 1 and len({names[r] for r in range(4, 8)}) == 1
    assert names[0] != names[4]


def test_a_host_that_dies_stops_every_host(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    out, port = tmp_path / "job", free_port()
    procs = [_launcher(k, port, out, [PROG, "--steps", "400", "--sleep", "0.05"]) for k in (0, 1)]
    log0 = tmp_path / "host0.log"
    deadline = time.monotonic() + 180
    while "step=3 " not in log0.read_text() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.2)
    assert "step=3 " in log0.read_text(), log0.read_text()
    os.killpg(procs[1].pid, signal.SIGKILL)  # host 1: its launcher, zygote and ranks, at once
    (code0, text0), (code1, _) = _finish(procs)
    assert code0 == 1 and code1 == -signal.SIGKILL
    assert "host 1 (" in text0 and "went away" in text0, text0
    assert not (out / "raw").exists() and not list(out.glob(".raw.tmp-*"))


def test_a_rank_that_fails_on_one_host_stops_every_host(tmp_path):
    out, results = _two_hosts(tmp_path, [PROG, "--steps", "5", "--fail-rank", "6"])
    (code0, text0), (code1, text1) = results
    assert code1 == 3 and "rank 6 failed with exit code 3" in text1, text1
    assert code0 == 1 and "host 1 (" in text0 and "rank 6 failed (exit code 3)" in text0, text0
    assert not (out / "raw").exists() and not list(out.glob(".raw.tmp-*"))


def test_a_rendezvous_that_never_completes(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    out, port = tmp_path / "job", free_port()
    (code, text), = _finish([_launcher(0, port, out, [PROG], PRISM_RDZV_TIMEOUT="3")], timeout=120)
    assert code == 2
    assert "host(s) 1 of 2 never joined" in text, text
    assert not out.exists()
    (code, text), = _finish([_launcher(1, free_port(), out, [PROG], PRISM_RDZV_TIMEOUT="3")], timeout=120)
    assert code == 2 and "host 1 (" in text and "could not reach the rendezvous" in text, text


def test_a_host_whose_share_does_not_fit(tmp_path):
    def few_files():  # host 1 may hold 60 open files: too few for 4 capture ranks' ends (80)
        resource.setrlimit(resource.RLIMIT_NOFILE, (60, 60))

    tmp_path.mkdir(exist_ok=True)
    out, port = tmp_path / "job", free_port()
    procs = [_launcher(0, port, out, [PROG]), _launcher(1, port, out, [PROG], preexec=few_files)]
    for code, text in _finish(procs, timeout=180):
        assert code == 2, text
        assert "host 1 (" in text and "open files" in text and "No rank was started on any host" in text, text
        assert "Traceback" not in text
    assert not out.exists()


# -- an emulation over hosts ------------------------------------------------------------------------------------
EMULATED = "dp4-tp2-ep4"
SANDBOX = "2,6"  # one on each host; tp index 0 (both print the loss); members of one DP group and one EP group
# meta.json's emulation numbers that say what moved (not how long it took)
MOVED = ["pruning", "timed", "communicators", "worker_communicators", "bytes_moved", "sandbox_bytes_sent",
         "worker_bytes_sent", "framing_bytes", "collective_messages", "collectives_replayed", "messages_replayed",
         "replayed_events", "cuda_folds"]


def _losses(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("step=") and " loss=" in line)


def _emulation_did(out: Path) -> dict:
    """What an emulation's OUT says the sandbox and the replayed ranks did: every raw stream (what, not when),
    the sandbox ranks' logs, and meta.json's numbers of what moved."""
    raw = {}
    for folder in sorted(p for p in (out / "raw").iterdir() if p.is_dir()):
        raw[folder.name] = {f.name: _arrow(f).select(WHAT).to_pylist() if f.name == "events.arrow"
                            else _arrow(f).select(EXCHANGED).to_pylist() if f.name == "exchanges.arrow"
                            else _arrow(f).to_pylist() for f in sorted(folder.glob("*.arrow"))}
    logs = {p.name: p.read_text() for p in sorted((out / "logs").iterdir())}
    import json

    meta = json.loads((out / "raw" / "meta.json").read_text())
    return {"raw": raw, "logs": logs, "moved": {k: meta["emulation"][k] for k in MOVED},
            "job": {k: meta[k] for k in ("mode", "world_size", "sandbox", "devices")}}


def test_two_hosts_emulation_equals_one_host(captured, tmp_path):
    """The job captured over two hosts, calibrated, then emulated over two hosts (sandbox rank 2 on host 0, 6
    on host 1, the replay worker on host 0) and on one: the sandbox ranks print the capture's losses bitwise,
    and both emulations' artifacts are equal but for times and the host fields."""
    job, results, _, single = captured(EMULATED)
    assert all(code == 0 for code, _ in results), results
    for stage, made in (("graph", "graph"), ("calibrate", "calibrated")):  # a calibrated job: the timed replay
        if not (job / made).is_dir():
            proc = run_prism([stage, "--job", str(job)], timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
    prog, one = LAYOUTS[EMULATED], tmp_path / "one"
    emu = ("--mode", "emulate", "--capture", str(job), "--sandbox", SANDBOX)
    (two, hosts), alone = run_together(
        lambda: _two_hosts(tmp_path, prog, out_name="two", mode=emu),
        lambda: run_prism(["launch", "--nproc", "8", "--devices", "1", *emu, "--out", str(one), *prog], timeout=300))
    assert alone.returncode == 0, alone.stderr[-3000:]
    for code, text in hosts:
        assert code == 0, text
    expected = sorted(set(_losses(single.stdout)))
    assert len(expected) == 2 and _losses(alone.stdout) == sorted(expected * 2)
    assert _losses(hosts[0][1]) == _losses(hosts[1][1]) == expected  # rank 2 on host 0, rank 6 on host 1
    did = _emulation_did(two)
    assert sorted(did["raw"]) == ["rank=2", "rank=6", "replay"] and did["moved"]["timed"]
    assert did == _emulation_did(one)
    import json

    meta = json.loads((two / "raw" / "meta.json").read_text())
    assert meta["nnodes"] == 2 and [h["ranks"] for h in meta["hosts"]] == [[0, 4], [4, 8]]
    assert meta["nodes"]["2"] != meta["nodes"]["6"]
    clock = meta["hosts"][1]  # one machine: its clocks are one, the exchange's estimate within its error
    assert 0 < clock["clock_rtt_ns"] and abs(clock["clock_offset_ns"]) <= clock["clock_rtt_ns"] // 2 + 1
    # the emulate stage's tables from each launch (host 1's rows put on host 0's clock): equal but for times
    tables = [_stage_events(job, out, force=k > 0) for k, out in enumerate((two, one))]
    assert tables[0] == tables[1]
    for bad, why in (([str(job)], "not an emulation of this job's capture"),
                     ([str(two), "--devices", "1"], "--devices belong to the launch, which already ran"),
                     ([str(two), "--sandbox", "2"], "ran the sandbox 2,6, not --sandbox 2")):
        proc = run_prism(["emulate", "--job", str(job), "--force", "--launched", *bad])
        assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _stage_events(job: Path, launched: Path, force: bool) -> list[dict]:
    """`prism emulate --launched`'s events table built from an emulation launched into `launched`: its columns
    but times, in (rank, seq) order."""
    proc = run_prism(["emulate", "--job", str(job), "--launched", str(launched), *(["--force"] if force else [])],
                     timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = pq.read_table(job / "emulation" / "events.parquet")
    assert all(s <= e for s, e in zip(events["start_ns"].to_pylist(), events["end_ns"].to_pylist()))
    return events.select([c for c in WHAT + ["source"] if c in events.column_names]).sort_by(
        [("rank", "ascending"), ("seq", "ascending")]).to_pylist()


@pytest.fixture(scope="module")
def loop_capture(tmp_path_factory):
    """hosts_loop.py, 12 steps, captured at W=8 on one host slot (the emulations below add a sleep between steps)."""
    job = tmp_path_factory.mktemp("loop") / "job"
    cap = run_prism(["launch", "--nproc", "8", "--devices", "1", "--mode", "capture", "--out", str(job),
                     PROG, "--steps", "12"], timeout=300)
    assert cap.returncode == 0, cap.stderr[-3000:]
    return job


def test_a_host_that_dies_mid_emulation_stops_every_host(loop_capture, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    out, port = tmp_path / "emu", free_port()
    emu = ("--mode", "emulate", "--capture", str(loop_capture), "--sandbox", "0,5")
    procs = [_launcher(k, port, out, [PROG, "--steps", "12", "--sleep", "0.3"], mode=emu) for k in (0, 1)]
    log0 = tmp_path / "host0.log"
    deadline = time.monotonic() + 180
    while "step=3 " not in log0.read_text() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.1)
    assert "step=3 " in log0.read_text(), log0.read_text()
    os.killpg(procs[1].pid, signal.SIGKILL)  # host 1: its launcher, zygote and sandbox rank 5, at once
    (code0, text0), (code1, _) = _finish(procs)
    assert code0 == 1 and code1 == -signal.SIGKILL
    assert "host 1 (" in text0 and "went away during the emulation" in text0, text0
    assert not (out / "raw").exists() and not list(out.glob(".*.tmp-*"))


def test_a_sandbox_rank_that_fails_on_one_host_stops_every_host(loop_capture, tmp_path):
    emu = ("--mode", "emulate", "--capture", str(loop_capture), "--sandbox", "0,5")
    out, results = _two_hosts(tmp_path, [PROG, "--steps", "12", "--fail-rank", "5"], out_name="emu", mode=emu)
    (code0, text0), (code1, text1) = results
    assert code1 == 3 and "rank 5 failed with exit code 3" in text1, text1
    assert code0 == 1 and "host 1 (" in text0 and "rank 5 failed (exit code 3)" in text0, text0
    assert not (out / "raw").exists() and not list(out.glob(".*.tmp-*"))
