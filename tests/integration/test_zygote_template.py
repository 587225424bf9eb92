"""A launch whose zygote is forked from a warm template (`prism.runtime.launch.zygote_template`) runs what a new
zygote runs: the same environment, cores, folder and threads in every rank, the same events in real, capture and
slice mode, the same failures, signals and clean-up; a launch the template does not fit gets a new zygote."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.runtime.launch import launcher
from prism.runtime.launch.zygote_template import Template
from tests.conftest import REPO, make_env as _make_env

pytestmark = pytest.mark.slow

SAME = ("seq", "kind", "op", "group_name", "group_seq", "peer", "tag", "bytes", "shape", "iteration", "microbatch")
FACTS = """
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.ones(2, 4)).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad()
env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "TORCHELASTIC_RUN_ID")
       and not k.startswith("PRISM_") or k == "PRISM_MODE"}
print(json.dumps({"rank": dist.get_rank(), "sum": t.tolist(), "threads": torch.get_num_threads(),
                  "cores": sorted(os.sched_getaffinity(0)), "cwd": os.getcwd(), "path0": sys.path[0],
                  "backend": dist.get_backend(), "env": env, "weight": model.weight.sum().item()}), flush=True)
"""
MOE = ["-m", "prism.workloads.moe_gpt", "--dp", "2", "--steps", "3", "--hidden", "64", "--ffn-hidden", "128",
       "--seq-len", "32", "--layers", "2", "--device", "cpu"]


def make_env(**extra: str) -> dict[str, str]:
    """The tests' environment for a launch, without pytest's per-test variable (which a template's environment
    would never match)."""
    env = _make_env(**extra)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def run_prism(args: list[str], timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=make_env(**env))


@pytest.fixture(scope="module")
def template():
    with Template.start(launcher.template_environment(make_env())) as t:
        yield t


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def events(raw: Path, rank: int) -> list[dict]:
    with pa.ipc.open_stream(str(raw / f"rank={rank}" / "events.arrow")) as reader:
        return reader.read_all().select(list(SAME)).to_pylist()


def zygote_of(out: Path) -> str:
    return json.loads((out / "raw" / "meta.json").read_text())["zygote"]


def facts(stdout: str) -> list[dict]:
    return sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")), key=lambda f: f["rank"])


def differences(got: list[dict], want: list[dict]) -> list[str]:
    out = []
    for g, w in zip(got, want):
        for key in set(g) | set(w):
            if key == "env":
                out += [f"rank {w['rank']} env {k}: {g['env'].get(k)!r} != {w['env'].get(k)!r}"
                        for k in set(g["env"]) | set(w["env"]) if g["env"].get(k) != w["env"].get(k)]
            elif g.get(key) != w.get(key):
                out.append(f"rank {w['rank']} {key}: {g.get(key)!r} != {w.get(key)!r}")
    return out


def no_process_runs(marker: str) -> bool:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return not [pid for pid in out if int(pid) != os.getpid()]


@pytest.mark.parametrize("mode", ["real", "capture"])
def test_a_run_from_the_template_is_the_run_of_a_new_zygote(tmp_path, template, mode):
    prog = write(tmp_path, "facts.py", FACTS)
    args = ["launch", "--nproc", "2", "--mode", mode, *(["--devices", "1"] if mode == "capture" else ["--pin"])]
    new = run_prism([*args, "--out", str(tmp_path / "new"), str(prog)], timeout=120)
    forked = run_prism([*args, "--out", str(tmp_path / "forked"), str(prog)], timeout=120,
                       PRISM_ZYGOTE_TEMPLATE=template.path)
    assert new.returncode == 0 and forked.returncode == 0, new.stderr + forked.stderr
    assert "not used" not in forked.stderr, forked.stderr
    assert zygote_of(tmp_path / "new") == "new" and zygote_of(tmp_path / "forked") == "template"
    got, want = facts(forked.stdout), facts(new.stdout)
    assert len(want) == 2 and differences(got, want) == []  # environment, cores, threads, folder, results
    assert want[0]["backend"] == "gloo" and want[0]["env"]["PRISM_MODE"] == mode
    for rank in (0, 1):
        assert events(tmp_path / "forked" / "raw", rank) == events(tmp_path / "new" / "raw", rank)


def test_a_slice_run_from_the_template_repeats_the_capture(tmp_path, template):
    job = tmp_path / "job"
    cap = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(job / "capture"),
                     *MOE], timeout=120)
    assert cap.returncode == 0, cap.stderr
    for cmd in (["-m", "prism.cli", "graph", "--job", str(job), "--raw", str(job / "capture" / "raw"), "--out",
                 str(job / "graph")], ["-m", "prism.slices.plan", "--job", str(job), "--devices", "1"]):
        done = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=REPO, env=make_env(),
                              timeout=120)
        assert done.returncode == 0, done.stderr
    other = tmp_path / "job2"
    shutil.copytree(job, other)
    runs = {}
    for folder, extra in ((job, {}), (other, {"PRISM_ZYGOTE_TEMPLATE": template.path})):
        runs[folder] = subprocess.run([sys.executable, "-m", "prism.slices.run", "--job", str(folder), "--slice", "0"],
                                      capture_output=True, text=True, cwd=REPO, env=make_env(**extra), timeout=120)
        assert runs[folder].returncode == 0, runs[folder].stderr
    assert "not used" not in runs[other].stderr
    steps = [sorted(l for l in runs[f].stdout.splitlines() if l.startswith("step=")) for f in (job, other)]
    assert steps[0] and steps[0] == steps[1]
    tables = [pq.read_table(f / "slices" / "slice=0" / "events.parquet") for f in (job, other)]
    cols = [c for c in SAME if c in tables[0].column_names] + ["event_id", "comm_id"]
    assert tables[0].select(cols).to_pylist() == tables[1].select(cols).to_pylist()


def test_each_zygote_of_a_template_draws_its_own_random_state(tmp_path, template):
    prog = write(tmp_path, "draws.py", """
        import random, numpy, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        print(f"draw {dist.get_rank()} {torch.rand(1).item()} {numpy.random.rand()} {random.random()}", flush=True)
    """)
    draws = []
    for i in range(2):
        proc = run_prism(["launch", "--nproc", "2", "--out", str(tmp_path / f"job{i}"), str(prog)], timeout=120,
                         PRISM_ZYGOTE_TEMPLATE=template.path)
        assert proc.returncode == 0 and "not used" not in proc.stderr, proc.stderr
        draws.append([line.split()[2:] for line in sorted(proc.stdout.splitlines()) if line.startswith("draw")])
    first, second = draws
    assert len(first) == 2 and first[0][:2] == first[1][:2]  # the ranks of a launch share the zygote's torch, numpy
    assert all(a != b for a, b in zip(first[0], second[0]))  # another launch, other draws (as new zygotes make)


def test_a_failing_rank_is_reported_as_from_a_new_zygote(tmp_path, template):
    prog = write(tmp_path, "fail_from_template_unique.py", """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            time.sleep(0.3)
            raise RuntimeError("deliberate failure on rank one")
        dist.all_reduce(torch.ones(1))
    """)
    proc = run_prism(["launch", "--nproc", "2", "--out", str(tmp_path / "job"), str(prog)], timeout=60,
                     PRISM_ZYGOTE_TEMPLATE=template.path)
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 failed with exit code 1" in proc.stderr and "deliberate failure on rank one" in proc.stderr
    assert not (tmp_path / "job" / "raw").exists()
    assert no_process_runs("fail_from_template_unique.py")


def _sleepy(tmp_path: Path, name: str, template: Template) -> subprocess.Popen:
    prog = write(tmp_path, name, """
        import time, torch.distributed as dist
        dist.init_process_group("gloo")
        print("started", flush=True)
        time.sleep(120)
    """)
    launch = subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "2", "--out",
                               str(tmp_path / "job"), str(prog)], cwd=REPO,
                              env=make_env(PRISM_ZYGOTE_TEMPLATE=template.path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert launch.stdout.readline().strip() == "started", launch.stderr.read() if launch.poll() is not None else ""
    return launch


def _gone(marker: str, within: float = 10.0) -> bool:
    until = time.monotonic() + within
    while time.monotonic() < until:
        if no_process_runs(marker):
            return True
        time.sleep(0.2)
    return False


def test_sigterm_to_the_launcher_stops_the_zygote_and_its_ranks(tmp_path, template):
    launch = _sleepy(tmp_path, "sleepy_template_term_unique.py", template)
    launch.send_signal(signal.SIGTERM)
    try:
        launch.wait(timeout=20)
    finally:
        launch.kill()
    assert launch.returncode == 128 + signal.SIGTERM, launch.stderr.read()
    assert _gone("sleepy_template_term_unique.py")
    assert not (tmp_path / "job").exists()
    assert template.proc.poll() is None  # the template serves the next launch


def test_a_killed_launcher_takes_its_zygote_and_ranks_along(tmp_path, template):
    launch = _sleepy(tmp_path, "sleepy_template_kill_unique.py", template)
    launch.kill()  # no clean-up of its own: the lifeline tells the zygote
    launch.wait()
    assert _gone("sleepy_template_kill_unique.py")
    assert template.proc.poll() is None


def test_a_zygote_dies_with_its_template(tmp_path):
    with Template.start(launcher.template_environment(make_env())) as own:
        launch = _sleepy(tmp_path, "sleepy_template_dies_unique.py", own)
        own.proc.kill()
        try:
            launch.wait(timeout=20)
        finally:
            launch.kill()
    assert launch.returncode != 0
    assert _gone("sleepy_template_dies_unique.py")


def test_a_launch_the_template_does_not_fit_gets_a_new_zygote(tmp_path, template):
    prog = write(tmp_path, "facts.py", FACTS)
    proc = run_prism(["launch", "--nproc", "2", "--pin", "--out", str(tmp_path / "job"), str(prog)], timeout=120,
                     PRISM_ZYGOTE_TEMPLATE=template.path, TORCH_LOGS_OF_THIS_TEST="x")
    assert proc.returncode == 0, proc.stderr
    assert "not used: another environment at the import of torch (TORCH_LOGS_OF_THIS_TEST)" in proc.stderr
    assert zygote_of(tmp_path / "job") == "new"
    assert all(f["env"]["TORCH_LOGS_OF_THIS_TEST"] == "x" for f in facts(proc.stdout))
