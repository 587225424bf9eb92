"""A timed run's cores are its own (issue 23: two `prism emulate` at once both ran on one core, 36 s instead of
~9 s, so both timings were wrong). A pinned run claims the cores it pins to (`prism.runtime.launch.cores`):
a second one takes other free cores, or, when too few are free, waits for them (PRISM_LOCK_WAIT) and is then
refused naming the holders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import PROGRAMS, make_env, run_prism, REPO

pytestmark = pytest.mark.slow

PROBE = re.compile(r"cores rank=(\d+) \[([\d, ]+)\] ([\d.]+) ([\d.]+)")

HOLDER = textwrap.dedent("""
    import os, sys, time
    from prism.runtime.launch import cores
    claim = cores.CoreClaim(len(os.sched_getaffinity(0)), "the test's holder")
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    claim.release()
""")


def test_two_concurrent_emulations_never_share_a_core(tmp_path):
    cap = tmp_path / "cap"
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(cap),
                      str(PROGRAMS / "core_probe.py")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = [subprocess.Popen([sys.executable, "-m", "prism.cli", "launch", "--nproc", "2", "--mode", "emulate",
                              "--capture", str(cap), "--sandbox", "1", "--devices", "1", "--pin", "--out",
                              str(tmp_path / name), str(PROGRAMS / "core_probe.py")], cwd=REPO, env=make_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    outs = [r.communicate(timeout=180) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], [e[-2000:] for _, e in outs]
    seen = []
    for (out, _), name in zip(outs, ("a", "b")):
        rank, cores, began, ended = PROBE.search(out).groups()
        seen.append(({int(c) for c in cores.split(",")}, float(began), float(ended)))
        meta = json.loads((tmp_path / name / "raw" / "meta.json").read_text())
        assert meta["pinned_cores"] == sorted(seen[-1][0])
    (cores_a, a0, a1), (cores_b, b0, b1) = seen
    if len(os.sched_getaffinity(0)) >= 2:
        assert a0 < b1 and b0 < a1, "both ran at once (each needs one of this machine's cores)"
    if a0 < b1 and b0 < a1:  # at the same time: on different cores
        assert not cores_a & cores_b, seen


def test_a_pinned_run_waits_for_busy_cores_or_is_refused_naming_their_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "60"], cwd=REPO, env=make_env(), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run_prism(["launch", "--nproc", "1", "--pin", str(PROGRAMS / "ddp.py")], PRISM_LOCK_WAIT="0")
        assert proc.returncode == 2, proc.stderr
        assert f"held by pid {holder.pid}: the test's holder" in proc.stderr, proc.stderr
        assert "PRISM_LOCK_WAIT=S waits longer" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "2"], cwd=REPO, env=make_env(), stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    proc = run_prism(["launch", "--nproc", "1", "--pin", str(PROGRAMS / "ddp.py")], PRISM_LOCK_WAIT="60")
    holder.wait()
    assert proc.returncode == 0, proc.stderr
    assert "[prism] waiting for 1 free core(s)" in proc.stderr, proc.stderr
