"""Capture mode: `dist.new_group` for a rank outside the new group, without torch's per-call machinery.

Megatron-style programs create every group of the job in every rank (4,384 groups a rank at
tp8·pp4·dp256·ep8) and keep the few that contain the rank. For a non-member torch's `new_group` does no
communication and makes no group, but it still costs ~30-50 us a call in a capture rank (this VM, Python
3.11, loaded; `scripts/group_creation_cost.py --per-call`): the wait-counter wrapper, `_new_group_with_tag`'s checks (a
Python loop over the members), the default group looked up ~7 times, the environment read for the init
barrier, prism's own `_new_process_group_helper` wrapper, the group-rank dictionary. W ranks times that on
P slots is slot time before the first step (~95 s of 16 slots at W=8192 on the host, session 7).

`install()` puts a `new_group` in front of torch's that answers a plain non-member call itself, with what
torch leaves behind that a program can observe:
- the same return value (`GroupMember.NON_GROUP_MEMBER`);
- the group counter advanced by one (`_world.group_count`: the names of the later groups, members' groups
  included, depend on it), through torch's own `_process_group_name`;
- `_world.pg_group_ranks[NON_GROUP_MEMBER]` = the group's global rank -> group rank map, as torch leaves it;
- the same checks of the arguments: anything torch would reject (duplicate or out-of-range ranks, a bad
  timeout or backend) goes to torch's own `new_group`, which raises its own error.
Everything else goes to torch's `new_group` unchanged: a member's call (the group is made by prism's backend
as before, so the graph's groups artifact is the same), `use_local_synchronization`, an explicit
`device_id` or a default group bound to a device (NCCL's split needs every rank), a default group with its
own `new_group` (torch hands the call to it), the init barrier
(`TORCH_DIST_INIT_BARRIER=1`: every rank joins it), TorchComms, a group name already taken, positional
arguments past `ranks`, keywords this torch's `new_group` does not have, ranks that are not a list, tuple or
range, an empty rank list. Not kept: torch's wait counter `pytorch.wait_counter.c10d.new_group` (an internal
metric) does not count the calls answered here. `PRISM_FAST_NONMEMBER=0` turns this off.
"""

from __future__ import annotations

import functools
import inspect
import os
from datetime import timedelta

from prism import settings

ENV = settings.FAST_NONMEMBER.name
# new_group's keywords a fast answer understands (the others take torch's path)
_KEYWORDS = ("ranks", "timeout", "backend", "pg_options", "use_local_synchronization", "group_desc", "device_id",
             "sort_ranks")
_SEQUENCES = (list, tuple, range)
answered = 0  # non-member calls answered here in this process (a test's window)


def enabled() -> bool:
    return settings.FAST_NONMEMBER.get()


def fast_new_group(original, c10d):
    """A `new_group` that answers a plain non-member call itself and passes every other to `original`
    (torch's `new_group` of module `c10d`)."""
    world = c10d._world
    non_member = c10d.GroupMember.NON_GROUP_MEMBER
    backend_type, default_timeout = c10d.Backend, c10d._get_default_timeout
    name_of = c10d._process_group_name
    torchcomms = getattr(c10d, "_use_torchcomms_enabled", None)
    try:
        accepted = frozenset(_KEYWORDS).intersection(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        accepted = frozenset(("ranks", "timeout", "backend", "pg_options", "group_desc"))
    # the default group, its rank and size (C++ calls: asked once per default group), and whether torch hands
    # new groups to it (a default group with its own `new_group`: torch's path)
    mine = [None, 0, 0, False]

    @functools.wraps(original)
    def new_group(*args, **kwargs):
        global answered
        if len(args) > 1 or not accepted.issuperset(kwargs):
            return original(*args, **kwargs)
        ranks = args[0] if args else kwargs.get("ranks")
        if type(ranks) not in _SEQUENCES or not ranks or kwargs.get("use_local_synchronization") \
                or kwargs.get("device_id") is not None:
            return original(*args, **kwargs)
        pg = world.default_pg
        if pg is None or pg.bound_device_id is not None or (torchcomms is not None and torchcomms()):
            return original(*args, **kwargs)
        if mine[0] is not pg:
            mine[:] = pg, pg.rank(), pg.size(), callable(getattr(pg, "new_group", None))
        _, rank, size, delegated = mine
        if delegated:
            return original(*args, **kwargs)
        try:  # anything odd about the arguments: torch's own path says what (or accepts it)
            if kwargs.get("sort_ranks", True):
                ranks = sorted(ranks)
                low, high = ranks[0], ranks[-1]
            else:
                ranks = list(ranks)
                low, high = min(ranks), max(ranks)
            # a member, or duplicates / a rank out of range (torch's error): torch's path
            plain = rank not in ranks and len(set(ranks)) == len(ranks) and low >= 0 and high < size
            if plain:
                backend = backend_type(kwargs.get("backend") or world.pg_map[pg][0])
                timeout = kwargs.get("timeout")
                plain = isinstance(default_timeout(backend) if timeout is None else timeout, timedelta)
        except (TypeError, ValueError, KeyError, RuntimeError):
            plain = False
        if not plain or os.getenv("TORCH_DIST_INIT_BARRIER", "0") != "0" \
                or str(world.group_count) in world.pg_names.values():
            return original(*args, **kwargs)
        name_of(ranks, use_hashed_name=False)  # the group counter, as torch advances it
        world.pg_group_ranks[non_member] = dict(zip(ranks, range(len(ranks))))
        answered += 1
        return non_member

    new_group._prism_fast_nonmember = True
    return new_group


def install() -> bool:
    """Route `torch.distributed.new_group` through `fast_new_group` (once; not with PRISM_FAST_NONMEMBER=0).
    Returns whether it is installed."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if getattr(c10d.new_group, "_prism_fast_nonmember", False):
        return True
    if not enabled():
        return False
    try:
        fast = fast_new_group(c10d.new_group, c10d)
    except AttributeError:  # a torch without one of the internals it uses: torch's new_group as it is
        return False
    c10d.new_group = dist.new_group = fast
    return True
