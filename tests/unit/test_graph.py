"""The graph stage: comm matching, wait links, coordinates, artifacts, and every user-caused error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from prism import graph, schemas
from rawgen import RawJob, job_members, megatron_job, rank_of


def run_graph(job: RawJob, tmp_path: Path) -> dict[str, pl.DataFrame]:
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    return {name: pl.read_parquet(tmp_path / "graph" / f"{name}.parquet") for name in ("events", "comms", "groups", "ranks")}


@pytest.fixture(scope="module")
def pp_job(tmp_path_factory) -> tuple[RawJob, dict[str, pl.DataFrame], Path]:
    folder = tmp_path_factory.mktemp("pp")
    job = megatron_job(tp=2, dp=2, pp=2, iterations=2)
    return job, run_graph(job, folder), folder


def test_collectives_hold_exactly_their_members_events(pp_job):
    _, g, _ = pp_job
    events, comms, groups = g["events"], g["comms"], g["groups"]
    coll = comms.filter(pl.col("kind") == "collective")
    # per iteration: tp all_reduce + tp broadcast on 4 tp groups, dp all_reduce on 4 dp groups
    assert coll.height == 2 * (4 + 4 + 4)
    order = dict(zip(groups["group_name"], groups["members"].to_list()))
    for comm in coll.iter_rows(named=True):
        assert comm["members"] == order[comm["group_name"]]
        assert comm["n_members"] == len(comm["members"])
        rows = events.filter(pl.col("event_id").is_in(comm["event_ids"])).sort("event_id")
        by_id = {e["event_id"]: e for e in rows.iter_rows(named=True)}
        assert [by_id[i]["rank"] for i in comm["event_ids"]] == comm["members"]
        assert {(e["kind"], e["op"], e["group_name"], e["group_seq"], e["comm_id"]) for e in by_id.values()} == {
            ("collective", comm["op"], comm["group_name"], comm["group_seq"], comm["comm_id"])
        }
        assert comm["bytes"] == rows["bytes"].sum()
        assert comm["t_first_start_ns"] == rows["t_start_ns"].min()
        assert comm["t_last_end_ns"] == rows["t_end_ns"].max()
        assert comm["src"] == (comm["members"][0] if comm["op"] == "broadcast" else -1)
    # every collective event belongs to exactly the comm that lists it
    coll_events = events.filter(pl.col("kind") == "collective")
    listed = coll.select("comm_id", event_id="event_ids").explode("event_id")
    assert coll_events.height == listed.height
    joined = coll_events.join(listed, on="event_id")
    assert (joined["comm_id"] == joined["comm_id_right"]).all()


def test_sends_pair_with_recvs(pp_job):
    _, g, _ = pp_job
    events, comms = g["events"], g["comms"]
    p2p = comms.filter(pl.col("kind") == "p2p")
    # per iteration: 4 halo sends in TP groups, 4 forward and 4 backward pipeline sends
    assert p2p.height == 2 * 12
    by_id = {e["event_id"]: e for e in events.iter_rows(named=True)}
    for comm in p2p.iter_rows(named=True):
        send, recv = (by_id[i] for i in comm["event_ids"])
        assert comm["members"] == [comm["src"], comm["dst"]]
        assert (send["kind"], send["rank"], send["peer"], send["tag"]) == ("send", comm["src"], comm["dst"], comm["tag"])
        assert (recv["kind"], recv["rank"], recv["peer"], recv["tag"]) == ("recv", comm["dst"], comm["src"], comm["tag"])
        assert send["comm_id"] == recv["comm_id"] == comm["comm_id"]
        assert comm["group_seq"] == -1 and comm["n_members"] == 2
    p2p_events = events.filter(pl.col("kind").is_in(["send", "recv"]))
    assert (p2p_events["comm_id"] >= 0).all() and p2p_events.height == 2 * p2p.height


def test_waits_point_at_their_op(pp_job):
    _, g, _ = pp_job
    events = g["events"]
    by_id = {e["event_id"]: e for e in events.iter_rows(named=True)}
    waits = events.filter(pl.col("kind") == "wait")
    assert waits.height > 0
    for w in waits.iter_rows(named=True):
        op = by_id[w["op_event_id"]]
        assert op["rank"] == w["rank"] and op["work_id"] == w["work_id"] and op["seq"] < w["seq"]
        assert op["kind"] in schemas.COMM_KINDS and op["is_async"]
        assert w["comm_id"] == -1
    others = events.filter(pl.col("kind") != "wait")
    assert (others["op_event_id"] == -1).all()
    assert (events.filter(pl.col("kind").is_in(["compute", "marker"]))["comm_id"] == -1).all()


def test_events_are_rank_major_with_global_ids(pp_job):
    job, g, _ = pp_job
    events = g["events"]
    assert events["event_id"].to_list() == list(range(events.height))
    assert events.select("rank", "seq").rows() == sorted(events.select("rank", "seq").rows())
    assert events.height == sum(len(e) for e in job.events)


def test_groups_and_ranks(pp_job):
    job, g, _ = pp_job
    groups, ranks = g["groups"], g["ranks"]
    assert sorted(groups["group_name"]) == sorted(x["group_name"] for x in job.groups)
    assert (groups["members"] == groups["ring"]).all()
    assert (groups["size"] == groups["members"].list.len()).all()
    assert ranks["rank"].to_list() == list(range(8))
    for r in ranks.iter_rows(named=True):
        t, d, p = r["tp"], r["dp"], r["pp"]
        assert rank_of(t, d, p, tp=2, dp=2) == r["rank"]
        assert r["ep"] == -1 and r["node"] == "testhost" and r["iterations"] == 2
        assert r["n_events"] == len(job.events[r["rank"]])


@pytest.mark.parametrize(
    "descs, expect",
    [("mesh", ("tp", "dp")), ("anon", ()), ("none", ())],
)
def test_coordinates_without_plain_descs(tmp_path, descs, expect):
    ranks = run_graph(megatron_job(tp=2, dp=2, descs=descs), tmp_path)["ranks"]
    for r in ranks.iter_rows(named=True):
        tp, dp = r["rank"] % 2, r["rank"] // 2
        assert r["tp"] == (tp if "tp" in expect else -1)
        assert r["dp"] == (dp if "dp" in expect else -1)
        assert r["pp"] == -1 and r["ep"] == -1


def test_ddp_program_and_nodes(tmp_path):
    """Only the default group: no coordinate is named; nodes come from meta.json."""
    job = RawJob(2)
    world = job.group("default_pg", [0, 1])
    job.nodes = {"0": "a", "1": "b"}
    for _ in range(3):
        for r in range(2):
            job.compute(r)
        works = job.collective(world, "all_reduce", 64, is_async=True)
        for r in range(2):
            job.wait(r, works[r])
    g = run_graph(job, tmp_path)
    assert g["ranks"].select("node", "tp", "dp", "iterations").rows() == [("a", -1, -1, 1), ("b", -1, -1, 1)]
    assert g["comms"].height == 3


def test_artifacts_carry_schema_and_version(pp_job):
    _, _, folder = pp_job
    for name in ("events", "comms", "groups", "ranks"):
        path = folder / "graph" / f"{name}.parquet"
        schema = pq.read_schema(path)
        assert schema.metadata[b"schema_version"] == schemas.SCHEMA_VERSION.encode()
        assert schema.remove_metadata().equals(schemas.ALL[name].remove_metadata()), name
    assert not [p for p in (folder / "graph").iterdir() if p.name.startswith(".")]


def test_rerun_replaces_outputs(tmp_path):
    job = megatron_job(iterations=1)
    first = run_graph(job, tmp_path)
    second = run_graph(job, tmp_path)
    assert first["comms"].equals(second["comms"])


def test_scales_to_many_ranks(tmp_path):
    g = run_graph(megatron_job(tp=4, dp=4, pp=4, iterations=1), tmp_path)
    assert g["ranks"].height == 64
    assert (g["ranks"]["tp"] >= 0).all() and (g["ranks"]["pp"] >= 0).all()


# ------------------------------------------------------------------------------------------ errors


def _drop_last_broadcast(job: RawJob) -> None:
    job.drop(3, lambda e: e["op"] == "broadcast" and e["iteration"] == 1)


def _mismatch_op(job: RawJob) -> None:
    job.find(3, op="all_reduce", group_name=job.find(3, op="broadcast")[0]["group_name"])[1]["op"] = "all_gather"


def _resize(job: RawJob) -> None:
    job.find(3, op="all_reduce")[0]["bytes"] = 12


def _reroot(job: RawJob) -> None:
    job.find(3, op="broadcast")[0]["peer"] = 3


def _drop_recv(job: RawJob) -> None:
    job.drop(1, lambda e: e["kind"] == "recv" and e["iteration"] == 1)


def _drop_send(job: RawJob) -> None:
    job.drop(0, lambda e: e["kind"] == "send" and e["iteration"] == 0)


def _retag(job: RawJob) -> None:
    job.find(1, kind="recv")[0]["tag"] = 99


def _orphan_wait(job: RawJob) -> None:
    job.find(2, kind="wait")[0]["work_id"] = 999


def _foreign_group(job: RawJob) -> None:
    job.find(0, op="all_reduce")[0]["group_name"] = job.find(1, op="broadcast")[0]["group_name"] + "x"


ERRORS = {
    "missing member": (_drop_last_broadcast, ["broadcast #3 on group", "not by [3]", "[2, 3]"]),
    "mismatched op": (_mismatch_op, ["different ops", "all_gather on ranks [3]", "all_reduce on ranks [2]"]),
    "sizes": (_resize, ["different sizes", "12 bytes on ranks [3]"]),
    "root": (_reroot, ["root"]),
    "send without recv": (_drop_recv, ["rank 0", "to rank 1", "no matching recv"]),
    "recv without send": (_drop_send, ["rank 1", "no matching send"]),
    "tag": (_retag, ["recv #0 on rank 1 from rank 0 with tag 99", "no matching send"]),
    "orphan wait": (_orphan_wait, ["rank 2", "work_id 999"]),
    "unknown group": (_foreign_group, ["rank 0", "not a group"]),
}


def _expect_error(tmp_path: Path, capsys, needles: list[str]) -> str:
    assert graph.main(["--job", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "graph").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    return err


@pytest.mark.parametrize("case", list(ERRORS))
def test_inconsistent_streams(tmp_path, capsys, case):
    mutate, needles = ERRORS[case]
    job = megatron_job(tp=2, dp=2, iterations=2)
    mutate(job)
    job.write(tmp_path)
    _expect_error(tmp_path, capsys, needles)


def test_missing_raw_dir(tmp_path, capsys):
    _expect_error(tmp_path, capsys, [str(tmp_path / "raw"), "run the capture"])


def test_no_ranks(tmp_path, capsys):
    megatron_job(iterations=1).write(tmp_path)
    for folder in (tmp_path / "raw").glob("rank=*"):
        shutil.rmtree(folder)
    _expect_error(tmp_path, capsys, ["no rank=R folders"])


def test_missing_rank(tmp_path, capsys):
    megatron_job(iterations=1).write(tmp_path)
    shutil.rmtree(tmp_path / "raw" / "rank=2")
    _expect_error(tmp_path, capsys, ["ranks [2] missing", "world_size=4"])


def test_world_size_larger_than_ranks(tmp_path, capsys):
    megatron_job(iterations=1).write(tmp_path)
    meta = tmp_path / "raw" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "world_size": 6}))
    _expect_error(tmp_path, capsys, ["ranks [4, 5] missing"])


def test_truncated_stream(tmp_path, capsys):
    megatron_job(iterations=2).write(tmp_path)
    stream = tmp_path / "raw" / "rank=1" / "events.arrow"
    data = stream.read_bytes()
    stream.write_bytes(data[: len(data) - 100])
    _expect_error(tmp_path, capsys, [str(stream), "truncated"])


def test_killed_rank_left_tmp_stream(tmp_path, capsys):
    megatron_job(iterations=1).write(tmp_path)
    stream = tmp_path / "raw" / "rank=3" / "events.arrow"
    stream.rename(stream.with_name("events.arrow.tmp"))
    _expect_error(tmp_path, capsys, [str(stream), "killed"])


def test_seq_gap(tmp_path, capsys):
    job = megatron_job(iterations=1)
    job.events[2][5]["seq"] = 50
    job.write(tmp_path)
    _expect_error(tmp_path, capsys, ["rank=2", "row 5 has seq 50"])


def test_groups_disagree(tmp_path, capsys):
    job = megatron_job(iterations=1)
    job.write(tmp_path)
    rows = [{"rank": 1, **g} for g in job.groups if 1 in g["members"]]
    rows[1]["members"] = [1, 0]  # rank 1's view of tp group "1" differs from rank 0's
    with ipc.new_stream(tmp_path / "raw" / "rank=1" / "groups.arrow", schemas.RAW_GROUPS) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schemas.RAW_GROUPS))
    _expect_error(tmp_path, capsys, ["group '1'", "[0, 1]", "[1, 0]"])


def test_bad_meta(tmp_path, capsys):
    megatron_job(iterations=1).write(tmp_path)
    (tmp_path / "raw" / "meta.json").write_text('{"world_size": "four"}')
    _expect_error(tmp_path, capsys, ["meta.json", "world_size"])


def test_job_members_helper_agrees_with_groups():
    job = megatron_job(tp=2, dp=2)
    assert job_members(job, "0") == [0, 1, 2, 3]


def _two_channels_job(recv_order: tuple[str, str]) -> tuple[RawJob, str, str]:
    """Ranks 0 and 1 share two groups; rank 0 sends on group a (8 bytes) then on b (16 bytes), same tag;
    rank 1 receives them in `recv_order`."""
    job = RawJob(world=2)
    a, b = job.group("a", [0, 1]), job.group("b", [0, 1])
    sizes = {a: 8, b: 16}
    for group in (a, b):
        job.p2p(0, "send", 1, sizes[group], group, tag=5)
    for name in recv_order:
        group = {"a": a, "b": b}[name]
        job.p2p(1, "recv", 0, sizes[group], group, tag=5)
    return job, a, b


def test_messages_pair_within_their_group(tmp_path):
    # the first send (on a) pairs with the second recv (on a): matching only on sender, receiver and tag
    # would pair it with the first recv (on b) and see 8 vs 16 bytes
    job, a, b = _two_channels_job(("b", "a"))
    g = run_graph(job, tmp_path)
    by_id = {e["event_id"]: e for e in g["events"].iter_rows(named=True)}
    p2p = g["comms"].filter(pl.col("kind") == "p2p")
    assert p2p.height == 2
    for comm in p2p.iter_rows(named=True):
        send, recv = (by_id[i] for i in comm["event_ids"])
        assert send["group_name"] == recv["group_name"] == comm["group_name"]
        assert send["bytes"] == recv["bytes"] == comm["bytes"] == {a: 8, b: 16}[comm["group_name"]]
    # the recv on b is rank 1's first event, the one on a its second
    assert [by_id[i]["seq"] for c in p2p.sort("group_name").iter_rows(named=True)
            for i in c["event_ids"]] == [0, 1, 1, 0]


def test_a_message_on_another_group_does_not_match(tmp_path, capsys):
    job, a, b = _two_channels_job(("a", "a"))
    job.find(1, kind="recv")[1]["bytes"] = 8
    job.write(tmp_path)
    _expect_error(tmp_path, capsys, [f"send #0 from rank 0 to rank 1 with tag 5 on group {b!r}", "no matching recv"])


def _any_source_job(peer: int) -> RawJob:
    """Rank 0 receives from any source; ranks 1 and 2 each send it one message (rank 2 recorded first)."""
    job = RawJob(world=3)
    world = job.group("default_pg", [0, 1, 2])
    job.p2p(2, "send", 0, 8, world)
    job.p2p(1, "send", 0, 8, world)
    first = job.p2p(0, "recv", peer, 8, world)
    job.find(0, work_id=first)[0]["op"] = schemas.OP_RECV_ANYSOURCE
    job.wait(0, first)
    second = job.p2p(0, "recv", 1, 8, world)
    job.find(0, work_id=second)[0]["op"] = schemas.OP_RECV_ANYSOURCE
    job.wait(0, second)
    return job


def test_any_source_recv_pairs_with_the_recorded_sender(tmp_path):
    g = run_graph(_any_source_job(peer=2), tmp_path)
    by_id = {e["event_id"]: e for e in g["events"].iter_rows(named=True)}
    pairs = {}
    for comm in g["comms"].filter(pl.col("kind") == "p2p").iter_rows(named=True):
        send, recv = (by_id[i] for i in comm["event_ids"])
        pairs[comm["src"]] = recv["seq"]
        assert recv["op"] == schemas.OP_RECV_ANYSOURCE and recv["peer"] == send["rank"] == comm["src"]
    assert pairs == {2: 0, 1: 2}  # rank 0's first recv (seq 0) heard from rank 2, its second (seq 2) from 1


def test_any_source_recv_without_a_sender_is_explained(tmp_path, capsys):
    _any_source_job(peer=-1).write(tmp_path)
    _expect_error(tmp_path, capsys, ["rank 0 event seq 0", "recv from any source whose sender was never recorded"])
