"""A `prism bench overhead` run's rank runs on the core the bench names (`LaunchSpec.pin_cores`), not on the
launcher's default first free core: every variant of every round on the same one."""

import os

import pytest

from prism.bench import overhead

pytestmark = pytest.mark.slow


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core other than the first free one")
def test_the_rank_is_pinned_to_the_named_core(tmp_path):
    last = max(os.sched_getaffinity(0))
    workload = ["-m", "prism.workloads.moe_gpt", "--steps", "3", "--microbatches", "1"]
    durations, _ = overhead.run_variant("prismtrace", tmp_path / "run", 1, workload, 3, cores=[last])
    assert len(durations) == 1
    assert overhead.ranks_cores(tmp_path / "run", 1) == [[last]]
