"""prism/runtime/oom.py: sizes from CUDA's message, the records and the sentence the supervisor prints."""

from __future__ import annotations

import json

import pytest

from prism.runtime import oom


def test_requested_from_message() -> None:
    assert oom.requested_from_message("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0") == 20 * 2**20
    assert oom.requested_from_message("Tried to allocate 1.50 GiB") == 3 * 2**29
    assert oom.requested_from_message("Tried to allocate 512 B") == 512
    assert oom.requested_from_message("something else") is None


def test_limit_bytes() -> None:
    assert oom.limit_bytes(0.5) == 2**29
    with pytest.raises(ValueError, match="positive"):
        oom.limit_bytes(0)


def test_finding_and_write(tmp_path) -> None:
    assert oom.finding(tmp_path) is None
    rec = {"rank": 3, "iteration": 0, "microbatch": 2, "phase": "bwd_begin", "requested_bytes": 2097152,
           "limit_bytes": 2**30}
    (tmp_path / "rank3.oom.json").write_text(json.dumps(rec))
    text = oom.finding(tmp_path)
    assert ("rank 3 ran out of device memory under a limit of 1.000 GiB per rank at iteration 0, microbatch 2 "
            "(after bwd_begin), asking for 2,097,152 bytes (2.00 MiB)") in text
    assert f"exit code {oom.EXIT_CODE}" in text
    out = tmp_path / "job"
    path = oom.write_finding(tmp_path, out, {"world_size": 4, "mode": "capture"})
    data = json.loads(path.read_text())
    assert data["ooms"] == [rec] and data["exit_code"] == oom.EXIT_CODE
    assert [p.name for p in out.iterdir()] == ["oom.json"]
