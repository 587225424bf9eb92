"""A slice rank's captured results (runtime/slice/transport.py `CapturedResults`): loaded and checked before the
program runs up to PRISM_SLICE_PRELOAD_MB, the rest read ahead during the run; the same values either way."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import torch

from prism import schemas, settings
from prism.runtime import shm
from prism.runtime.slice.transport import CapturedResults, MissingResult

N = 6  # results of rank 0
SIZE = 4096  # floats per result


@pytest.fixture
def capture(tmp_path):
    """A capture folder with rank 0's payload index (N 'out' rows, one 'in' row) and the payload files."""
    store = shm.PayloadStore(tmp_path / "payloads")
    values = [torch.arange(SIZE, dtype=torch.float32) * (i + 1) for i in range(N)]
    rows = [dict(rank=0, work_id=10 * i, key=f"c:g{i}", role="out", hash=store.put(shm.encode([v])),
                 nbytes=v.numel() * 4) for i, v in enumerate(values)]
    rows.append(dict(rank=0, work_id=5, key="c:in", role="in", hash=store.put(shm.encode([torch.ones(3)])),
                     nbytes=12))
    folder = tmp_path / "raw" / "rank=0"
    folder.mkdir(parents=True)
    with pa.OSFile(str(folder / "payloads.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, schemas.RAW_PAYLOADS) as writer:
        writer.write_table(pa.Table.from_pylist(rows[::-1], schema=schemas.RAW_PAYLOADS))  # order: by work_id
    return tmp_path, values


def _all(results: CapturedResults) -> list[torch.Tensor]:
    return [results.take(f"c:g{i}").result(timeout=10)[1][0] for i in range(N)]


def test_every_result_is_loaded_before_the_run_within_the_bound(capture):
    cap, values = capture
    results = CapturedResults(cap, 0, preload_bytes=10**9)
    results.preload()
    assert results.stats["preloaded"] == N and results.stats["during_run"] == 0
    assert results._pool is None  # no helper thread beside the program
    assert "c:in" not in results and all(f"c:g{i}" in results for i in range(N))
    assert all(torch.equal(got, want) for got, want in zip(_all(results), values))
    assert results._loading == {}  # each result is held until taken, then let go


@pytest.mark.parametrize("fits", [0, 2])
def test_past_the_bound_the_rest_is_read_during_the_run_with_the_same_values(capture, capsys, fits):
    cap, values = capture
    one = (cap / "payloads").rglob("*.bin").__next__().stat().st_size
    results = CapturedResults(cap, 0, preload_bytes=fits * one + one // 2)
    results.preload()
    assert results.stats["preloaded"] == fits
    assert f"{N - fits} of {N} captured results" in capsys.readouterr().err  # said once, naming the knob
    assert all(torch.equal(got, want) for got, want in zip(_all(results), values))
    assert results.stats["during_run"] == N - fits and results.stats["during_run_cpu_s"] >= 0


def test_a_damaged_result_is_named_before_the_program_runs(capture):
    cap, _ = capture
    results = CapturedResults(cap, 0, preload_bytes=10**9)
    path = results._file("c:g2")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(shm.CorruptPayload, match="capture again"):
        results.preload()


def test_a_missing_result_is_named_before_the_program_runs(capture):
    cap, _ = capture
    results = CapturedResults(cap, 0, preload_bytes=0)  # even when none is to be held: checked at the start
    path = results._file("c:g3")
    path.unlink()
    with pytest.raises(MissingResult, match=f"{path}: missing.*capture again"):
        results.preload()


def test_the_stats_file_names_what_was_loaded_and_the_threads_cpu(capture, tmp_path):
    cap, _ = capture
    results = CapturedResults(cap, 0, preload_bytes=10**9)
    results.preload()
    results.write_stats(tmp_path / "out")
    stats = json.loads((tmp_path / "out" / "slice_results.json").read_text())
    assert stats["results"] == N and stats["preloaded_bytes"] == stats["bytes"] > N * SIZE * 4
    assert "MainThread" in stats["threads_cpu_s"]


def test_the_bound_is_a_setting_in_mb():
    assert settings.SLICE_PRELOAD_MB.get({}) == 1024.0
    assert settings.SLICE_PRELOAD_MB.get({"PRISM_SLICE_PRELOAD_MB": "0"}) == 0.0
    with pytest.raises(ValueError, match="PRISM_SLICE_PRELOAD_MB"):
        settings.SLICE_PRELOAD_MB.get({"PRISM_SLICE_PRELOAD_MB": "lots"})


def test_a_group_finds_its_collectives_with_a_result_by_number(tmp_path):
    """`collective_seqs`: the seqs of one group's keys `c-<group>-<seq>`, not another group's whose name
    extends it (`1` against `1-2`), a '/' in a name as `key_name` writes it, nothing for a group without one."""
    from prism.runtime.capture.client import key_name

    store = shm.PayloadStore(tmp_path / "payloads")
    keys = [key_name(("c", g, s)) for g, s in (("1", 0), ("1", 7), ("1-2", 3), ("a/b", 4), ("10", 5))]
    rows = [dict(rank=0, work_id=i, key=k, role="out", hash=store.put(shm.encode([torch.ones(2)])), nbytes=8)
            for i, k in enumerate(keys)]
    folder = tmp_path / "raw" / "rank=0"
    folder.mkdir(parents=True)
    with pa.OSFile(str(folder / "payloads.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, schemas.RAW_PAYLOADS) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schemas.RAW_PAYLOADS))
    results = CapturedResults(tmp_path, 0)
    assert results.collective_seqs("1") == {0, 7}
    assert results.collective_seqs("1-2") == {3}
    assert results.collective_seqs("a/b") == {4}
    assert results.collective_seqs("10") == {5}
    assert results.collective_seqs("2") == frozenset()
