"""Framework features prism cannot carry (issue 21, bad input; tests/programs/unsupported_features.py): one
line from the launcher naming the feature and the rank, exit code 2, no traceback, nothing published under
--out, no rank left running; before the first iteration where the feature shows before it (a backend, a
communicator built outside the interception, RPC), at the op's issue where it shows only there (a reduction
or a tensor layout prism cannot compute, torch's symmetric memory). Before this, the same programs ran on gloo with the program's own
backend silently replaced, ran with their traffic missing from the trace, hung in capture, or failed deep
inside the capture transport."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import PROGRAMS, run_prism, run_together, run_torchrun

pytestmark = pytest.mark.slow

PROG = PROGRAMS / "unsupported_features.py"
# feature -> (modes refused, words the one line holds, whether it is refused before the first iteration)
FEATURES = {
    "backend": (("real", "capture"), ["process group 'default_pg' asks for backend 'own'", "backend='gloo'"], True),
    # a group other than the default one: refused at its first op (one never used is no error, below)
    "group_backend": (("capture",), ["all_reduce on a process group, which asks for backend 'own'"], False),
    "direct_gloo": (("real", "capture"), ["a ProcessGroupGloo built from its class", "new_group"], True),
    "rpc": (("real", "capture"), ["torch.distributed.rpc (init_rpc)", "TensorPipe"], True),
    "premul_sum": (("capture",), ["all_reduce with ReduceOp.PREMUL_SUM in group 0 (default_pg)",
                                  "set_force_sum_reduction_for_comms"], False),
    "sparse": (("capture",), ["all_reduce of a sparse_coo tensor", "dense"], False),
    # torch's symmetric memory but async TP's fused ops (those run as torch's fallback: test_async_tp.py)
    "symm_mem_buffer": (("capture",), ["torch.distributed._symmetric_memory.empty (a symmetric memory buffer)",
                                       "live on its own GPU", "--mode real"], False),
    "symm_mem_op": (("capture",), ["torch.ops.symm_mem.one_shot_all_reduce in group 0 (default_pg)",
                                   "fused_all_gather_matmul"], False),
}
CASES = [(f, m) for f, (modes, _, _) in FEATURES.items() for m in modes]


def _alive(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in open(f"/proc/{entry.name}/cmdline", "rb").read():
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _launch(tmp_path, feature: str, mode: str):
    prog = tmp_path / f"unsupported_{feature}_{mode}_{os.getpid()}.py"  # a name no other process has
    shutil.copy(PROG, prog)
    extra = ["--devices", "1"] if mode == "capture" else ["--hang-timeout", "20"]
    out = tmp_path / f"{feature}-{mode}"
    proc = run_prism(["launch", "--nproc", "2", "--mode", mode, *extra, "--out", str(out), str(prog),
                      "--feature", feature], timeout=120)
    return proc, out, prog


@pytest.mark.parametrize("feature, mode", CASES, ids=[f"{f}-{m}" for f, m in CASES])
def test_an_uncarried_feature_is_one_error_naming_it_and_the_rank(tmp_path, feature, mode):
    _, words, before_first = FEATURES[feature]
    proc, out, prog = _launch(tmp_path, feature, mode)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "feature prism cannot carry" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("[prism] the program uses a feature prism cannot carry: rank ")
    assert f"{prog.name}:" in line and "Fix: " in line, line  # where in the program, and what to do
    for w in words:
        assert w in line, (w, line)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ("iteration 0" not in proc.stdout) == before_first, proc.stdout
    assert "result x0" not in proc.stdout  # no iteration completed on a wrong footing
    assert not (out / "raw").exists() and not list(out.glob(".raw.tmp*"))
    assert not _alive(prog.name)


def test_a_group_on_an_uncarried_backend_that_is_never_used_is_no_error(tmp_path):
    """torchtitan puts its size-1 and 'batch' mesh dimensions on torch's fake backend; they never communicate."""
    proc = run_prism(["launch", "--nproc", "2", "--mode", "capture", "--devices", "1", "--out", str(tmp_path / "cap"),
                      str(PROG), "--feature", "unused_fake"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result done 0" in proc.stdout and "result done 1" in proc.stdout


def test_the_same_programs_run_under_torchrun_and_real_mode_where_gloo_carries_them(tmp_path):
    """The refusals are prism's, not the programs' faults: torchrun runs a sparse all_reduce and a gloo group built
    from its class, and real mode (gloo underneath) still carries the sparse all_reduce."""
    runs = run_together(*[lambda f=f: run_torchrun(2, [str(PROG), "--feature", f], timeout=120)
                          for f in ("sparse", "direct_gloo")],
                        lambda: run_prism(["launch", "--nproc", "2", "--out", str(tmp_path / "real"), str(PROG),
                                           "--feature", "sparse"], timeout=120))
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sorted(line for line in proc.stdout.splitlines() if line.startswith("result done")) == \
            ["result done 0", "result done 1"]
    assert (tmp_path / "real" / "raw").is_dir()
