"""Capture at scale, checked at small W: a group costs a rank nothing until it uses it, and the machine's
limits are refused before any rank starts (the full-size figures: docs/benchmarks.md)."""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys

import pytest

from tests.conftest import REPO, make_env, run_prism

pytestmark = pytest.mark.slow

PROGRAMS = REPO / "tests" / "programs"


def test_unused_groups_cost_nothing(tmp_path):
    job = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out", str(job),
                      str(PROGRAMS / "unused_groups.py"), "2000", "200"], timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "sum=[16.0, 16.0, 16.0, 16.0]" in proc.stdout  # ones, all-reduced twice over 4 ranks
    growth = int(re.search(r"nonmember_growth_bytes=(\d+)", proc.stdout)[1])
    assert growth < 1 << 20, f"2000 groups rank 0 is not in grew its private memory by {growth} bytes"
    meta = json.loads((job / "raw" / "meta.json").read_text())
    assert meta["capture"]["groups"] == 1  # only the world group ever reached the coordinator
    # the zygote's objects were made immortal before the fork (3.12+), or it says why not
    done = meta["capture"]["immortal"]
    # what bounds a capture, for `prism bench capture`: the fork loop, the coordinator's CPU against its wall
    cap = meta["capture"]
    assert 0 < cap["fork_s"] < cap["coordinator_wall_s"] + cap["fork_s"] <= meta["wall_s"], cap
    assert 0 < cap["coordinator_cpu_s"], cap
    assert done.get("objects", 0) > 10000 if sys.version_info >= (3, 12) else "PEP 683" in done["skipped"], done
    # and it took its C heap's free chunks (`memory.fill_heap_holes`): a rank's allocations land on fresh pages
    holes = cap["heap_holes"]
    assert holes["chunks"] > 100 and holes["bytes"] > 0 and holes["free_left"] < 1 << 20, holes
    for r in range(4):
        stats = json.loads((job / "raw" / f"rank={r}" / "capture_stats.json").read_text())
        assert stats["groups_used"] == 1
        assert stats["groups_created"] == 1 + (200 if r < 2 else 2000)
        # the groups a rank is not in were answered by prism's non-member new_group (nonmember_groups)
        assert stats["nonmember_groups_answered"] == (2000 if r < 2 else 200)


def test_ranks_output_in_files_reaches_the_launcher(tmp_path):
    """The fallback beyond the open-file limit's pipes (forced here at W=4): each rank's stdout and stderr go to
    files, forwarded when it ends; the supervisor holds 2 descriptors a rank instead of 4."""
    job = tmp_path / "job"
    proc = run_prism(["launch", "--nproc", "4", "--mode", "capture", "--devices", "2", "--out", str(job),
                      str(PROGRAMS / "unused_groups.py"), "3", "3"], timeout=240, PRISM_RANK_OUTPUT="files")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("sum=[16.0, 16.0, 16.0, 16.0]") == 1 and "nonmember_growth_bytes=" in proc.stdout
    meta = json.loads((job / "raw" / "meta.json").read_text())
    assert meta["capture"]["groups"] == 1


def test_a_failing_ranks_traceback_comes_through_its_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
                   "print('rank says hello', flush=True)\n"
                   "if dist.get_rank() == 1:\n    raise RuntimeError('rank one fails on purpose')\n"
                   "dist.barrier()\n")
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(tmp_path / "job"),
                      str(bad)], timeout=240, PRISM_RANK_OUTPUT="files")
    assert proc.returncode != 0
    assert "RuntimeError: rank one fails on purpose" in proc.stderr, proc.stderr
    assert proc.stdout.count("rank says hello") == 2, proc.stdout


def _lower_nofile(n: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


def test_too_few_open_files_is_refused_before_any_rank_starts(tmp_path):
    job = tmp_path / "job"
    cmd = [sys.executable, "-m", "prism.cli", "launch", "--nproc", "64", "--mode", "capture", "--devices", "1",
           "--out", str(job), str(PROGRAMS / "unused_groups.py"), "0", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=make_env(),
                          preexec_fn=_lower_nofile(150))
    assert proc.returncode == 2, proc.stderr
    # 64 ranks' pipes need 4*64+64 = 320; their output in files 2*64+64 = 192, still more than 150
    assert "64 ranks need about 192 open files" in proc.stderr and "ulimit -n 192" in proc.stderr
    assert not (job / "raw").exists() and not list(job.glob(".*tmp*"))
    assert "nonmember_growth" not in proc.stdout
