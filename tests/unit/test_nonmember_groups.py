"""prism's non-member `new_group` (`prism.runtime.capture.nonmember_groups`, capture mode): every kind of call leaves
what torch's own `new_group` leaves (return value, errors, group counter and names, the non-member rank map),
and the plain non-member calls are the ones it answers."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import PROGRAMS, REPO, make_env


def _calls(how: str, **env: str) -> list[dict]:
    proc = subprocess.run([sys.executable, str(PROGRAMS / "nonmember_calls.py"), how], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=make_env(**env))
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_it_leaves_what_torch_leaves():
    torch_rows, fast_rows = _calls("torch"), _calls("fast")
    assert fast_rows.pop() == {"answered": 12}  # 9 plain non-member calls and 3 of new_subgroups(4)
    assert len(fast_rows) == len(torch_rows) == 19
    for mine, theirs in zip(fast_rows, torch_rows):
        assert mine == theirs, mine["call"]
    by_call = {row["call"]: row for row in torch_rows}  # the program does see what it must (hand-checked)
    assert by_call["non-member"]["value"] == -100 and by_call["member"]["value"]["ranks"] == [5, 6]
    assert by_call["unsorted kept"]["nonmember_map"] == [[7, 0], [3, 1]]
    assert "duplicate" in by_call["duplicates"]["error"] and "out of range" in by_call["negative"]["error"]
    assert by_call["member again"]["value"]["name"] == "17"  # 17 groups counted before it, non-members included


def test_turned_off():
    proc = subprocess.run([sys.executable, "-c", "from prism.runtime.capture import nonmember_groups as n; "
                           "import torch.distributed as d; print(n.install(), hasattr(d.new_group, "
                           "'_prism_fast_nonmember'))"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=make_env(PRISM_FAST_NONMEMBER="0"))
    assert proc.stdout.split() == ["False", "False"], proc.stderr
