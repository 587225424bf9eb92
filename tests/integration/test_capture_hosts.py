"""A capture spread over hosts: two launchers on this machine ("hosts" 0 and 1 on localhost, W=8 as 2 x 4 ranks
on one slot each) give the artifacts of a one-host capture of the same job, but for the host columns; a host
that dies, a rendezvous that never completes, a host whose share does not fit it: one error naming the host,
every host's ranks stopped, nothing published."""

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


def _launcher(k: int, port: int, out: Path, prog: list[str], nnodes: int = 2, nproc: int = 4, preexec=None,
              **env) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nnodes", str(nnodes), "--node-rank", str(k),
           "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc", str(nproc), "--devices", "1",
           "--mode", "capture", "--out", str(out), *prog]
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


def _two_hosts(tmp: Path, prog: list[str], **env) -> tuple[Path, list[tuple[int, str]]]:
    tmp.mkdir(parents=True, exist_ok=True)
    out, port = tmp / "job", free_port()
    return out, _finish([_launcher(k, port, out, prog, **env) for k in (0, 1)])


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


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_hosts_capture_equals_one_host(tmp_path, name):
    prog = LAYOUTS[name]
    one = tmp_path / "one" / "job"
    (job, results), single = run_together(
        lambda: _two_hosts(tmp_path / "two", prog),
        lambda: run_prism(["launch", "--nproc", "8", "--devices", "2", "--mode", "capture", "--out", str(one), *prog],
                          timeout=300))
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
