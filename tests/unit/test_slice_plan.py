"""Slice planner: slices fit P, keep the heaviest talkers together, cover every rank once; equivalence."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from prism import graph, schemas
from prism.slices import plan as slice_plan
from tests.unit.rawgen import megatron_job


def build(tmp_path: Path, **layout) -> Path:
    job = megatron_job(**layout)
    job.write(tmp_path)
    assert graph.main(["--job", str(tmp_path)]) == 0
    return tmp_path


def slices_of(job_dir: Path) -> dict[int, list[int]]:
    rows = pq.read_table(job_dir / "slices" / "plan.parquet").to_pylist()
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r["slice"], []).append(r["rank"])
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("devices", [1, 2, 3, 4, 8])
def test_slices_fit_and_cover_every_rank_once(tmp_path, devices):
    job = build(tmp_path, tp=2, dp=2, pp=2)
    assert slice_plan.main(["--job", str(job), "--devices", str(devices)]) == 0
    slices = slices_of(job)
    ranks = sorted(r for members in slices.values() for r in members)
    assert ranks == list(range(8))
    assert all(len(m) <= devices for m in slices.values())
    # heavy pairs are kept whole (clusters of 2 here), then packed: no two slices could be merged
    sizes = sorted(len(m) for m in slices.values())
    assert len(sizes) == 1 or sizes[0] + sizes[1] > devices


def test_the_bytes_rule_keeps_the_heaviest_talkers_together(tmp_path):
    # in this synthetic job a pipeline pair (r, r+4) exchanges 4 x 16 KiB activations and gradients per
    # iteration, more than a TP pair's all-reduces: the PP pairs are kept together
    job = build(tmp_path, tp=2, dp=2, pp=2)
    assert slice_plan.main(["--job", str(job), "--devices", "2", "--rule", "bytes"]) == 0
    assert sorted(slices_of(job).values()) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # with room for 4, a pipeline pair joins its TP partner's pair
    assert slice_plan.main(["--job", str(job), "--devices", "4", "--rule", "bytes"]) == 0
    assert sorted(slices_of(job).values()) in ([[0, 1, 4, 5], [2, 3, 6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]])


def test_sync_first_keeps_the_pairs_that_wait_on_each_other_most_together(tmp_path):
    # per iteration a TP pair shares 3 comms one of them waits on at once (the all-reduce, the broadcast, the halo
    # whose receive blocks), a PP pair 2 (the activation, whose send is asynchronous but whose receive blocks, and
    # the gradient): the default rule keeps the TP pairs, though the PP pairs exchange more bytes
    job = build(tmp_path, tp=2, dp=2, pp=2)
    assert slice_plan.main(["--job", str(job), "--devices", "2"]) == 0
    assert sorted(slices_of(job).values()) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # with room for 4: each TP pair, then its pipeline partner pair (2 synchronous comms) before its DP partner
    # (the gradient all-reduce is asynchronous on both members)
    assert slice_plan.main(["--job", str(job), "--devices", "4"]) == 0
    assert sorted(slices_of(job).values()) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_a_comm_counts_as_synchronous_when_either_rank_of_the_pair_waits_on_it():
    import polars as pl

    # comm 0: ranks 0,1 all-reduce, both asynchronous; comm 1: 0 -> 2 isend (async) into a blocking recv;
    # comm 2: ranks 1,3 blocking; comm 3: a 3-member group larger than p=2 (left out)
    events = pl.DataFrame({"rank": [0, 1, 0, 2, 1, 3, 0, 1, 2], "comm_id": [0, 0, 1, 1, 2, 2, 3, 3, 3],
                           "is_async": [True, True, True, False, False, False, False, False, False]})
    comms = pl.DataFrame({"comm_id": [0, 1, 2, 3], "members": [[0, 1], [0, 2], [1, 3], [0, 1, 2]],
                          "bytes": [10_000, 10, 10, 10]})
    assert dict(slice_plan._sync_counts(events, comms, 2)) == {(0, 2): 1, (1, 3): 1}
    order = slice_plan.pair_order(events, comms, 2, "sync-first")
    assert order[(0, 1)] == (0, 10_000.0) and order[(0, 2)] == (1, 10.0)
    # the asynchronous pair's bytes lose to the waiting pairs under sync-first, win under bytes
    assert slice_plan.cluster(4, 2, order) == [[0, 2], [1, 3]]
    assert slice_plan.cluster(4, 2, slice_plan.pair_order(events, comms, 2, "bytes")) == [[0, 1], [2, 3]]
    with pytest.raises(slice_plan.PlanError, match="--rule fastest: unknown; use one of sync-first, bytes"):
        slice_plan.pair_order(events, comms, 2, "fastest")


def test_keep_whole_puts_each_named_group_in_one_slice_before_the_rule(tmp_path, capsys):
    job = build(tmp_path, tp=2, dp=2, pp=2)
    # the bytes rule keeps the pipeline pairs (above); kept whole, the TP pairs win
    assert slice_plan.main(["--job", str(job), "--devices", "2", "--rule", "bytes", "--keep-whole", "tp"]) == 0
    assert sorted(slices_of(job).values()) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    capsys.readouterr()
    assert slice_plan.main(["--job", str(job), "--devices", "2", "--keep-whole", "tensor"]) == 2
    err = capsys.readouterr().err
    assert "--keep-whole tensor: no group of the graph is described so" in err and "tp" in err


def test_pair_weights_prefer_the_heaviest_group():
    weights = {(0, 1): 10.0, (1, 2): 100.0, (2, 3): 10.0, (0, 3): 1.0}
    assert slice_plan.cluster(4, 2, weights) == [[0, 3], [1, 2]]


def test_representative_measures_one_slice_per_class(tmp_path):
    job = build(tmp_path, tp=2, dp=2, pp=2)
    assert slice_plan.main(["--job", str(job), "--devices", "2", "--representative"]) == 0
    rows = pq.read_table(job / "slices" / "plan.parquet").to_pylist()
    measured = {r["slice"] for r in rows if r["measured"]}
    # the two DP replicas of a PP stage do the same work: one slice per stage is measured
    assert len(measured) == 2
    for r in rows:
        assert r["measured_by"] in measured
    meta = pq.read_schema(job / "slices" / "plan.parquet").metadata
    assert meta[b"schema_version"] == schemas.SCHEMA_VERSION.encode()


def test_missing_graph_is_a_clear_error(tmp_path, capsys):
    assert slice_plan.main(["--job", str(tmp_path), "--devices", "2"]) == 2
    err = capsys.readouterr().err
    assert "graph/events.parquet" in err and "missing" in err
