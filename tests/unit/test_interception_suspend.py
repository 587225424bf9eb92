"""`interception.suspend` / `resume` (`prism bench overhead --interleave`): a suspended real-mode rank has none of
PrismTrace's hooks in torch's global hook dicts and records nothing; resumed, it has them back and records each
step exactly as a rank that was never suspended records it."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

PROGRAM = r'''
import datetime, json, os, sys
import torch
import torch.distributed as dist
from torch.nn.modules import module as M
from torch.optim import optimizer as O
from prism.runtime import interception

out, schedule = sys.argv[1], [c == "1" for c in sys.argv[2]]
os.makedirs(out, exist_ok=True)
interception.install("real", out)
dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
DICTS = (M._global_forward_pre_hooks, M._global_forward_hooks, O._global_optimizer_pre_hooks,
         O._global_optimizer_post_hooks)
log = []
for on in schedule:
    (interception.resume if on else interception.suspend)()
    rec = interception.recorder()
    before = rec.recorded
    for _ in range(2):  # two microbatches
        model(torch.randn(8, 4)).sum().backward()
    t = torch.ones(1)
    dist.all_reduce(t)
    opt.step()
    opt.zero_grad()
    log.append({"on": on, "events": rec.recorded - before, "suspended": interception.suspended(),
                "hooks": [[getattr(h, "__module__", "?") for h in d.values()] for d in DICTS]})
print(json.dumps(log))
'''


def run(tmp_path: Path, name: str, schedule: str) -> tuple[list[dict], pa.Table]:
    prog = tmp_path / "toggle.py"
    prog.write_text(PROGRAM)
    out = tmp_path / name
    done = subprocess.run([sys.executable, str(prog), str(out), schedule], capture_output=True, text=True,
                          timeout=240, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    with pa.OSFile(str(out / "rank=0" / "events.arrow")) as f:
        table = pa.ipc.open_stream(f).read_all()
    return json.loads(done.stdout.strip().splitlines()[-1]), table


def per_iteration(table: pa.Table) -> dict[int, list[tuple]]:
    """Each iteration's events as (kind, op, microbatch, group, a collective, bytes, async), times and sequence numbers left out."""
    rows = table.to_pylist()
    out: dict[int, list[tuple]] = {}
    for r in rows:
        out.setdefault(r["iteration"], []).append((r["kind"], r["op"], r["microbatch"], r["group_name"], r["group_seq"] >= 0, r["bytes"], r["is_async"]))
    return out


@pytest.mark.timeout(300)
def test_suspended_steps_have_no_hook_and_record_nothing_resumed_ones_record_as_a_plain_rank(tmp_path):
    toggled, trace = run(tmp_path, "toggled", "101001")
    plain, plain_trace = run(tmp_path, "plain", "111")
    for step in toggled:
        if step["on"]:
            assert not step["suspended"]
            assert step["hooks"] == [["prism.runtime.markers"]] * 4  # prism's own, once each
            assert step["events"] > 0
        else:
            assert step["suspended"]
            assert step["hooks"] == [[], [], [], []]  # taken out of torch's dicts, not a flag in a hook
            assert step["events"] == 0
    # each on step records what a never-suspended rank records in its step: markers of both microbatches, the
    # all-reduce and its wait, the compute between them
    events = [s["events"] for s in toggled if s["on"]]
    assert events == [plain[0]["events"]] * 3 == [s["events"] for s in plain[:1]] * 3
    got, want = per_iteration(trace), per_iteration(plain_trace)
    assert sorted(got) == sorted(want) == [0, 1, 2]
    ops = [e[1] for e in want[1]]
    assert ops.count("fwd_begin") == 2 and ops.count("iteration_end") == 1 and "all_reduce" in ops
    # iteration 0 also holds the first compute span (from the recorder's start); the steps after it are exactly alike
    assert got[1] == want[1] and got[2] == want[2]
    assert [e for e in got[0] if e[0] != "compute"] == [e for e in want[0] if e[0] != "compute"]


def test_suspend_is_refused_before_any_group_and_in_capture(monkeypatch):
    from prism.runtime import interception

    monkeypatch.setitem(interception._state, "hooks", None)
    with pytest.raises(RuntimeError, match="no process group yet"):
        interception.suspend()
    monkeypatch.setitem(interception._state, "hooks", [])
    monkeypatch.setitem(interception._state, "mode", "capture")
    with pytest.raises(RuntimeError, match="only real mode can be suspended"):
        interception.suspend()
