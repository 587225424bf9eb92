"""Slice mode with the neighbours ring (`prism.runtime.slice.ring`): groups whose collectives are all
all-reduces (the world of 8, two halves of 4) are played by the replay server as the slice ranks' ring
neighbours, so no gloo instance of a virtual member exists for them; a pair group with a broadcast keeps the
members path. Every slice layout (one slice rank, two adjacent, two apart, two adjacent across the ring's wrap)
prints the capture's results: floats (the capture's), exact integer reductions (the ring's own sums from the
recorded contributions), a data-dependent size; a burst of async all-reduces runs two rings at a time (gloo's
worker threads), the server's plays overlapping."""

from __future__ import annotations

import json

import pytest

from prism import artifacts, job_paths
from tests.conftest import PROGRAMS, run_prism

pytestmark = pytest.mark.slow

PROGRAM = [str(PROGRAMS / "ring_groups.py")]


def _results(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("result "))


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring") / "capture"
    cap = run_prism(["launch", "--nproc", "8", "--mode", "capture", "--devices", "2", "--out", str(out), *PROGRAM])
    assert cap.returncode == 0, cap.stderr[-3000:]
    return out, _results(cap.stdout)


def _slice(capture, tmp_path, ranks: str, **env):
    out = tmp_path / f"slice-{ranks.replace(',', '-')}"
    proc = run_prism(["launch", "--nproc", "8", "--mode", "slice", "--slice-ranks", ranks, "--capture", str(capture),
                      "--out", str(out), *PROGRAM], **env)
    replay = json.loads((out / "raw" / "meta.json").read_text())["replay"] if proc.returncode == 0 else None
    return proc, replay


@pytest.mark.parametrize("ranks", ["0", "1,3", "0,7"])
def test_ring_groups_print_the_capture_results(capture, tmp_path, ranks):
    folder, want = capture
    proc, replay = _slice(folder, tmp_path, ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mine = {int(r) for r in ranks.split(",")}
    assert _results(proc.stdout) == [line for line in want if int(line.split()[2]) in mine]
    assert len(_results(proc.stdout)) == 32 * len(mine)
    halves = {"1" if r < 4 else "2" for r in mine}
    assert replay["ring_groups"] == sorted({"0"} | halves)  # the world and the slice ranks' halves
    assert replay["ring_messages"] > 0
    assert replay["virtual_members"] == len(mine)  # only the pair groups' partners: the broadcast's path


def test_members_path_and_a_bad_setting(capture, tmp_path):
    folder, want = capture
    proc, replay = _slice(folder, tmp_path, "1,3", PRISM_SLICE_RING="members")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(proc.stdout) == [line for line in want if line.split()[2] in ("1", "3")]
    assert replay["ring_groups"] == [] and replay["ring_messages"] == 0
    bad, _ = _slice(folder, tmp_path, "0", PRISM_SLICE_RING="fastest")
    assert bad.returncode != 0
    assert "PRISM_SLICE_RING='fastest'" in bad.stderr and "neighbours" in bad.stderr, bad.stderr[-2000:]


def test_a_burst_runs_two_rings_at_a_time(capture, tmp_path):
    """The world group's six async all-reduces, issued before any is waited on, are played two at a time:
    some pair of the server's plays of them overlaps (issue to completion), none is three deep."""
    folder, want = capture
    proc, _ = _slice(folder, tmp_path, "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ops = artifacts.read_raw_stream(job_paths.replay_stream(tmp_path / "slice-0", "ops.arrow")).to_pylist()
    world = sorted((r["t_issue_ns"], r["t_complete_ns"]) for r in ops if r["group_name"] == "0")
    assert all(b > a > 0 for a, b in world)
    depth = [sum(1 for a, b in world if a <= t < b) for t, _ in world]  # plays in flight at each issue
    assert max(depth) == 2, depth
