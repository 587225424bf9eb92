"""Mode emulate's pieces that need no processes: the mode table, participants, tags, contribution blobs."""

from __future__ import annotations

import pytest
import torch

from prism.runtime import emulation, modes


def test_every_mode_is_described_once():
    assert list(modes.MODES) == ["off", "real", "capture", "slice", "emulate"]
    assert [n for n, m in modes.MODES.items() if m.replay] == ["slice", "emulate"]
    assert modes.get("emulate").ranks_option == "--sandbox" and modes.partial("emulate")
    assert not modes.partial("capture") and modes.get("capture").coordinator
    with pytest.raises(ValueError, match="not a mode of this prism"):
        modes.get("bogus")


def test_participants_pruned_and_not():
    members = [0, 1, 2, 3, 4, 5]
    assert emulation.participants(members, {2}, True) == [(0, [0, 1]), (2, [2]), (3, [3, 4, 5])]
    assert emulation.participants(members, {0, 3}, True) == [(0, [0]), (1, [1, 2]), (3, [3]), (4, [4, 5])]
    assert emulation.participants(members, {2}, False) == [(m, [m]) for m in members]


def test_p2p_tags_tell_members_of_one_compensator_apart():
    n = 4
    tags = {emulation.p2p_tag(t, n, s, d) for t in range(3) for s in range(n) for d in range(n)}
    assert len(tags) == 3 * n * n and max(tags) < emulation.COLL_TAG


def test_blob_round_trip_keeps_members_metas_and_bits():
    a = torch.randn(3, 2)
    b = torch.arange(5, dtype=torch.int64)
    c = torch.randn(4).to(torch.bfloat16)
    blob = emulation.encode_parts([(2, {"op": "all_reduce"}, [a]), (3, {"splits": [1, 2]}, [b, c])])
    got = emulation.decode_parts(blob)
    assert sorted(got) == [2, 3]
    assert got[2][0] == {"op": "all_reduce"} and torch.equal(got[2][1][0], a)
    assert got[3][0] == {"splits": [1, 2]} and torch.equal(got[3][1][0], b) and torch.equal(got[3][1][1], c)
    assert emulation.decode_parts(emulation.encode_parts([])) == {}
