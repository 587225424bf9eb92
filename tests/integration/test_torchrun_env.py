"""A rank's environment under `prism launch` is torchrun's (issue 23: `prism launch --mode real` left
OMP_NUM_THREADS unset where torchrun sets 1 for every rank of a multi-process job, so the ground truth's
timing depended on a variable the user never set). torchrun ships with torch: the reference is run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import PROGRAMS, REPO, free_port, run_together

PROGRAM = str(PROGRAMS / "env_probe.py")
# what only one of the two sets, and why that is not a difference a program can tell from its timing
ONLY_PRISM_SETS = {"PRISM_MODE", "PRISM_STATUS_DIR",  # the interception's mode, the launcher's status folder
              "PYTHONPATH",  # prism's sitecustomize (the interception), before the user's own entries
              "PYTORCH_NVML_BASED_CUDA_CHECK",  # the zygote keeps CUDA uninitialised for its forked ranks
              "TORCHINDUCTOR_CACHE_DIR"}  # set by the zygote's warm torch._dynamo import
TORCHRUN_ONLY = {"TORCHELASTIC_ERROR_FILE",  # the agent's per-attempt error file (prism reports failures itself)
                 "TORCHELASTIC_USE_AGENT_STORE"}  # the agent hosts the store; under prism (real) rank 0 does
VALUES_DIFFER = {"MASTER_PORT", "TORCHELASTIC_RUN_ID"}  # a free port; prism's run id (raw/meta.json's)


def _envs(cmd: list[str], env: dict[str, str]) -> tuple[dict[int, dict], str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("env "):
            _, rank, blob = line.split(" ", 2)
            found[int(rank)] = json.loads(blob)
    return found, proc.stderr


def test_a_rank_sees_torchrun_s_environment():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS" and not k.startswith("PRISM_")}
    launch = [sys.executable, "-m", "prism.cli", "launch", "--nproc", "2", PROGRAM]
    (ref, ref_err), (got, got_err), (mine, _) = run_together(
        lambda: _envs([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                       f"--master-port={free_port()}", PROGRAM], env),
        lambda: _envs(launch, env),
        lambda: _envs(launch, {**env, "OMP_NUM_THREADS": "2"}))  # the user's own value is kept, as torchrun does
    assert sorted(ref) == sorted(got) == [0, 1]
    for rank in (0, 1):
        t, p = ref[rank], got[rank]
        assert t["OMP_NUM_THREADS"] == p["OMP_NUM_THREADS"] == "1"
        assert t["torch.get_num_threads"] == p["torch.get_num_threads"] == "1"
        assert set(t) - set(p) == TORCHRUN_ONLY, set(t) - set(p)
        assert set(p) - set(t) <= ONLY_PRISM_SETS, set(p) - set(t)
        differ = {k for k in set(t) & set(p) if t[k] != p[k]}
        assert differ == VALUES_DIFFER, {k: (t[k], p[k]) for k in differ}
        assert mine[rank]["OMP_NUM_THREADS"] == "2"
    warning = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
    assert warning in ref_err and warning in got_err
