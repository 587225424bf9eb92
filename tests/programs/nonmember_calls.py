"""`new_group` calls of every kind, by rank 5 of 16 on torch's fake backend (no communication), each one's
outcome and what torch leaves behind, as JSON lines: the return value (a member's group: its name, ranks and
this rank's group rank), the error of a rejected call, the group counter and the non-member rank map.
`python nonmember_calls.py fast|torch`: with prism's non-member `new_group` installed (fast) or not."""

import json
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", rank=5, world_size=16, store=FakeStore())
if sys.argv[1] == "fast":
    from prism.runtime.capture import nonmember_groups

    assert nonmember_groups.install()
    from torch.distributed import new_group  # after the install: the fast one
else:
    new_group = dist.new_group

CALLS = [
    ("non-member", lambda: new_group([0, 1])),
    ("member", lambda: new_group([5, 6])),
    ("unsorted non-member", lambda: new_group([3, 1, 2])),
    ("keywords", lambda: new_group(ranks=[8, 9], group_desc="x", pg_options=None)),
    ("duplicates", lambda: new_group([1, 1])),
    ("out of range", lambda: new_group([0, 16])),
    ("negative", lambda: new_group([-1, 2])),
    ("bad timeout", lambda: new_group([0, 1], timeout=5)),
    ("bad backend", lambda: new_group([0, 1], backend="nonsense")),
    ("timeout", lambda: new_group([0, 1], timeout=timedelta(seconds=5))),
    ("backend", lambda: new_group([0, 1], backend="gloo")),
    ("local sync", lambda: new_group([0, 1], use_local_synchronization=True)),
    ("unsorted kept", lambda: new_group([7, 3], sort_ranks=False)),
    ("range", lambda: new_group(range(8, 12))),
    ("tuple", lambda: new_group((12, 13))),
    ("positional timeout", lambda: new_group([14, 15], timedelta(seconds=9))),
    ("unsorted member kept", lambda: new_group([6, 5, 4], sort_ranks=False)),
    ("subgroups", lambda: dist.new_subgroups(4)),
    ("member again", lambda: new_group([4, 5, 6])),
]


def show(value):
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, (tuple, list)):
        return [show(v) for v in value]
    return {"name": value.group_name, "ranks": dist.get_process_group_ranks(value),
            "group_rank": dist.get_group_rank(value, 5)}


for what, call in CALLS:
    try:
        out = {"value": show(call())}
    except Exception as exc:  # noqa: BLE001 - the error is the outcome
        out = {"error": f"{type(exc).__name__}: {exc}"}
    world = c10d._world
    out.update(call=what, count=world.group_count, names=sorted(world.pg_names.values()),
               nonmember_map=list(world.pg_group_ranks.get(c10d.GroupMember.NON_GROUP_MEMBER, {}).items()))
    print(json.dumps(out))
if sys.argv[1] == "fast":
    print(json.dumps({"answered": nonmember_groups.answered}))
