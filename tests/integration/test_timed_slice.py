"""Timed slice runs (the calibration's second pass): the replay server's virtual ranks follow a calibrated
timeline, so a slice rank waits for a late virtual peer as long as the timeline says; the transfer measured
from the timed slice starts at the replayed member's issue, so that wait is not taken for a transfer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, make_env, run_prism

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROGRAM = ["-m", "prism.workloads.moe_gpt", "--dp", "2", "--steps", "4", "--hidden", "32", "--ffn-hidden", "64",
           "--seq-len", "16", "--layers", "1", "--device", "cpu"]
DELAY_NS = 600_000_000  # what the edited timeline adds to the virtual rank's iteration 2


def _module(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                          env=make_env(), timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """W=2 captured, slices of one rank each (untimed), the first calibration -> calibrated_untimed/."""
    job = tmp_path_factory.mktemp("timed") / "job"
    _ok(run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(job / "capture"),
                   *PROGRAM]))
    _ok(run_prism(["graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out", str(job / "graph")]))
    _ok(_module("prism.slices.plan", "--job", str(job), "--devices", "1"))
    for k in (0, 1):
        _ok(_module("prism.slices.run", "--job", str(job), "--slice", str(k)))
    _ok(_module("prism.calibrate.from_slices", "--job", str(job)))
    _ok(_module("prism.calibrate", "--job", str(job), "--durations", str(job / "slices" / "durations.parquet"),
                "--transfers", str(job / "slices" / "transfers.parquet"), "--out", str(job / "calibrated_untimed")))
    return job


def _delay_rank1_iteration2(job) -> None:
    """The first event of rank 1's iteration 2 lasts DELAY_NS longer in the timeline (and everything after)."""
    path = job / "calibrated_untimed" / "timeline.parquet"
    tl = pq.read_table(path)
    graph = pq.read_table(job / "graph" / "events.parquet", columns=["event_id", "rank", "seq", "iteration"])
    it = dict(zip(graph["event_id"].to_pylist(), graph["iteration"].to_pylist()))
    rank, seq, eid = (tl[c].to_numpy() for c in ("rank", "seq", "event_id"))
    first = min(int(s) for r, s, e in zip(rank, seq, eid) if r == 1 and it[int(e)] == 2)
    start, end = tl["start_ns"].to_numpy().copy(), tl["end_ns"].to_numpy().copy()
    later = (rank == 1) & (seq > first)
    start[later] += DELAY_NS
    end[later | ((rank == 1) & (seq == first))] += DELAY_NS
    tl = tl.set_column(tl.schema.get_field_index("start_ns"), "start_ns", pa.array(start, pa.int64()))
    tl = tl.set_column(tl.schema.get_field_index("end_ns"), "end_ns", pa.array(end, pa.int64()))
    pq.write_table(tl, path)  # the schema's metadata (run id) is kept


def _waited_ns(job, folder: str, iteration: int) -> int:
    """Rank 0's time in waits and blocking collectives in one iteration of its slice run."""
    ev = pq.read_table(job / folder / "slice=0" / "events.parquet").to_pylist()
    return sum(e["t_end_ns"] - e["t_start_ns"] for e in ev
               if e["rank"] == 0 and e["iteration"] == iteration and e["kind"] in ("wait", "collective"))


def test_a_timed_slice_waits_for_its_late_virtual_peer_and_measures_transfers_without_that_wait(job):
    _delay_rank1_iteration2(job)
    timeline = job / "calibrated_untimed" / "timeline.parquet"
    proc = _module("prism.slices.run", "--job", str(job), "--slice", "0", "--timed-by", str(timeline))
    _ok(proc)
    assert "(timed)" in proc.stdout
    untimed, timed = _waited_ns(job, "slices", 2), _waited_ns(job, "slices_timed", 2)
    # rank 1 arrives DELAY_NS later than calibrated: rank 0 waits that much longer than in its untimed run,
    # where the replayed peer answers at once (a margin for a loaded machine's noise)
    assert timed - untimed >= 0.7 * DELAY_NS, (untimed, timed)
    replay = pq.read_table(job / "slices_timed" / "slice=0" / "replay.parquet")
    comms = pq.read_table(job / "graph" / "comms.parquet")["comm_id"].to_pylist()
    assert replay.num_rows > 0 and set(replay["comm_id"].to_pylist()) <= set(comms)
    # the server's own record of the same ops: held at its gate (ready long before it issued) by the delay
    played = pq.read_table(job / "slices_timed" / "slice=0" / "replay_ops.parquet")
    assert set(replay["comm_id"].to_pylist()) <= set(played["comm_id"].to_pylist())
    held = (played["t_issue_ns"].to_numpy() - played["t_ready_ns"].to_numpy()).max()
    assert held >= 0.7 * DELAY_NS, held
    assert "the replay server's ops against the slice ranks'" in proc.stdout

    # the second slice timed too (rank 1 real, rank 0 replayed), then the durations of the timed pass
    _ok(_module("prism.slices.run", "--job", str(job), "--slice", "1", "--timed-by", str(timeline)))
    _ok(_module("prism.calibrate.from_slices", "--job", str(job), "--slices", "slices_timed"))
    transfers = pq.read_table(job / "slices_timed" / "transfers.parquet")["transfer_ns"].to_numpy()
    assert np.all(transfers < 0.5 * DELAY_NS), transfers.max()  # the wait for the late peer is no transfer


def test_timed_by_a_missing_timeline_exits_2_naming_the_stage(job, tmp_path):
    proc = _module("prism.slices.run", "--job", str(job), "--slice", "0", "--timed-by", str(tmp_path / "no.parquet"))
    assert proc.returncode == 2
    assert "calibrate the untimed slices first" in proc.stderr
    proc = run_prism(["launch", "--nproc", "2", "--mode", "real", "--timed-by", str(tmp_path / "x.parquet"),
                      *PROGRAM])
    assert proc.returncode == 2 and "--timed-by times a slice run" in proc.stderr


def test_an_untimed_slice_keeps_what_its_replay_server_played_op_by_op(job):
    """`slices/slice=K/replay_ops.parquet`: every op between the slice rank and its replayed peer, with the
    graph's comm, in the order ready <= issue <= issued <= complete on the slice's clock."""
    graph = pq.read_table(job / "graph" / "events.parquet").to_pylist()
    for k, real in ((0, 0), (1, 1)):
        played = pq.read_table(job / "slices" / f"slice={k}" / "replay_ops.parquet")
        want = {e["comm_id"] for e in graph if e["rank"] == real and e["comm_id"] >= 0}
        assert set(played["comm_id"].to_pylist()) == want  # W=2: every comm of the rank has the virtual peer
        t = {c: played[c].to_numpy() for c in ("t_ready_ns", "t_issue_ns", "t_issued_ns", "t_complete_ns")}
        assert (t["t_ready_ns"] <= t["t_issue_ns"]).all() and (t["t_issue_ns"] <= t["t_issued_ns"]).all()
        assert (t["t_issued_ns"] <= t["t_complete_ns"]).all()
        assert set(played["kind"].to_pylist()) == {"collective"} and set(played["virtual_members"].to_pylist()) == {1}
