"""prism/runtime/symmetric_memory.py in one process of a one-rank gloo group: async TP's fused ops run as torch's own
fallback once installed (and have no CPU kernel before: real mode's torch behaviour), every other symm_mem op and
the symmetric buffer APIs are an UnsupportedFeature naming the op and the rank, and `enable_symm_mem_for_group`
still works. The install changes the process's dispatcher, so the checks run in a subprocess of their own (the
multi-rank runs: tests/integration/test_async_tp.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, free_port, make_env

CHECKS = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from prism.runtime import symmetric_memory
    from prism.runtime.unsupported import UnsupportedFeature

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
    g = dist.group.WORLD.group_name
    out = {}

    def outcome(fn):
        try:
            fn()
        except UnsupportedFeature as exc:
            return "UnsupportedFeature: " + str(exc)
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return "ok"

    A, B, B2 = torch.randn(2, 4, 8), torch.randn(8, 3), torch.randn(8, 5)
    out["before"] = outcome(lambda: torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, g))
    symmetric_memory.install()
    symmetric_memory.install()  # idempotent
    out["carried"] = list(symmetric_memory.carried())
    out["refused"] = list(symmetric_memory.refused())
    full, (c, c2) = torch.ops.symm_mem.fused_all_gather_matmul(A, [B, B2], 1, g)
    _, (want_c, want_c2) = symm_mem._fused_all_gather_matmul_fallback(A, [B, B2], 1, g)  # torch's, called directly
    none, (d,) = torch.ops.symm_mem.fused_all_gather_matmul(A, [B], 0, g, return_A=False)
    out["all_gather_matmul"] = [torch.equal(full, A), torch.equal(c, want_c), torch.equal(c2, want_c2),
                                torch.allclose(c2, A @ B2), none is None, torch.equal(d, A @ B)]
    out["matmul_reduce_scatter"] = torch.equal(
        torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 1, g), A @ B)
    s = torch.tensor(1.0)
    a8, b8 = A.to(torch.float8_e4m3fn), B.t().contiguous().to(torch.float8_e4m3fn).t()
    # (fused_all_gather_scaled_matmul gathers fp8, which gloo refuses: "Invalid scalar type"; prism's groups carry it,
    # tests/integration/test_async_tp.py)
    z = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(a8, b8, s, s, "sum", 0, 0, g, [2, 4, 3],
                                                              out_dtype=torch.float32)
    want = torch._scaled_mm(a8.flatten(0, 1), b8, s, s, out_dtype=torch.float32).unflatten(0, (2, 4))
    out["scaled"] = torch.equal(z, want)
    t = torch.randn(8)
    out["one_shot_all_reduce"] = outcome(lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", g))
    out["_low_contention_all_gather"] = outcome(lambda: torch.ops.symm_mem._low_contention_all_gather(t, g))
    out["empty"] = outcome(lambda: symm_mem.empty(16, device="cpu"))
    out["rendezvous"] = outcome(lambda: symm_mem.rendezvous(t, dist.group.WORLD))
    out["get_symm_mem_workspace"] = outcome(lambda: symm_mem.get_symm_mem_workspace(g, 64))
    out["empty_strided_p2p"] = outcome(lambda: torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p(
        (4,), (1,), torch.float32, torch.device("cpu")))
    out["enable"] = outcome(lambda: symm_mem.enable_symm_mem_for_group(g))
    out["enabled"] = symm_mem.is_symm_mem_enabled_for_group(g)
    dist.destroy_process_group()
    print(json.dumps(out))
""")
FUSED = ["fused_all_gather_matmul", "fused_all_gather_scaled_matmul", "fused_matmul_reduce_scatter",
         "fused_scaled_matmul_reduce_scatter"]


@pytest.fixture(scope="module")
def found() -> dict:
    proc = subprocess.run([sys.executable, "-c", CHECKS, str(free_port())], capture_output=True, text=True,
                          timeout=180, cwd=REPO, env=make_env(RANK="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_without_prism_the_fused_ops_have_no_cpu_kernel(found):
    """What real mode keeps: torch's own error (prism installs nothing there)."""
    assert found["before"].startswith("NotImplementedError: Could not run 'symm_mem::fused_all_gather_matmul' "
                                      "with arguments from the 'CPU' backend"), found["before"]


def test_the_fused_ops_run_as_torchs_fallback(found):
    assert found["carried"] == FUSED
    assert found["all_gather_matmul"] == [True] * 6
    assert found["matmul_reduce_scatter"] is True
    assert found["scaled"] is True


def test_every_other_symm_mem_op_is_refused(found):
    assert {"one_shot_all_reduce", "two_shot_all_reduce_", "all_to_all_vdev", "_low_contention_all_gather",
            "multimem_all_reduce_", "nvshmem_put"} <= set(found["refused"])
    assert not set(found["refused"]) & set(FUSED)


@pytest.mark.parametrize("call, words", [
    ("one_shot_all_reduce", "rank 3: torch.ops.symm_mem.one_shot_all_reduce in group 0 (default_pg): "),
    ("_low_contention_all_gather", "rank 3: torch.ops.symm_mem._low_contention_all_gather in group 0 (default_pg): "),
    ("empty", "rank 3: torch.distributed._symmetric_memory.empty (a symmetric memory buffer): "),
    ("rendezvous", "rank 3: torch.distributed._symmetric_memory.rendezvous (a symmetric memory buffer) in group 0 "
                   "(default_pg): "),
    ("get_symm_mem_workspace", "rank 3: torch.distributed._symmetric_memory.get_symm_mem_workspace (a symmetric "
                               "memory buffer) in group 0 (default_pg): "),
    ("empty_strided_p2p", "rank 3: torch's _SymmetricMemory.empty_strided_p2p (a symmetric memory buffer): "),
])
def test_a_refusal_names_the_op_the_rank_the_cause_and_the_fix(found, call, words):
    text = found[call]
    assert text.startswith("UnsupportedFeature: " + words), text
    assert "needs every rank of the group live on its own GPU at once" in text
    assert "Fix: use torch.distributed collectives" in text and "--mode real" in text


def test_enable_symm_mem_for_group_still_works(found):
    """torchtitan 0.3.0 calls it (deprecated in torch 2.13): it records the group's store, nothing to refuse."""
    assert found["enable"] == "ok" and found["enabled"] is True


def test_a_kernel_torch_registered_from_python_is_overridden_on_a_torch_without_allow_override(monkeypatch):
    """torch 2.11's Library.impl has no allow_override and refuses, in Python alone, a key torch registered from
    Python (symm_mem's CUDA kernels): prism's install must still take it (on the H200's torch every prism run
    failed at install before)."""
    import torch

    from prism.runtime import symmetric_memory

    taken = []

    class Library211:
        ns = "symm_mem"

        def impl(self, name, kernel, device, **kwargs):
            if kwargs:
                raise TypeError("impl() got an unexpected keyword argument 'allow_override'")
            key = f"symm_mem/{name}/{device}"
            if key in torch.library._impls:
                raise RuntimeError("This is not allowed since there's already a kernel registered from python "
                                   f"overriding {name}'s behavior for {device} dispatch key and symm_mem namespace.")
            taken.append(key)

    monkeypatch.setattr(torch.library, "_impls", {"symm_mem/_low_contention_all_gather/CUDA"})
    symmetric_memory._override(Library211(), "_low_contention_all_gather", print, "CUDA")
    symmetric_memory._override(Library211(), "fused_all_gather_matmul", print, "CPU")
    assert taken == ["symm_mem/_low_contention_all_gather/CUDA", "symm_mem/fused_all_gather_matmul/CPU"]
