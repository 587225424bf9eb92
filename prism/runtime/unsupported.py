"""What prism cannot carry, refused where the program first uses it: one error naming the feature, the rank
and the fix, instead of a hang, a wrong trace or a silent fallback to gloo.

- A process group on a backend prism does not intercept (`init_process_group("mpi")`, a backend the program
  registered itself, torch's "fake"): prism would substitute its own gloo-like group and the program's
  backend would never run (`check_backend`: the default group at its creation, any other at its first op).
- A communicator built outside `init_process_group`/`new_group`, which the interception never sees: a
  `ProcessGroupGloo`/`ProcessGroupNCCL` made from its class, `torch.distributed.rpc` (TensorPipe builds one
  at `init_rpc`). Its traffic would bypass prism: missing from the trace, and in capture, where only some
  ranks run at a time, a rendezvous that never completes (`guard_direct_backends`, at construction). Under
  `prism launch` the interception is installed in the zygote before the program's first line, so such a
  communicator is the only way a group can exist "before" it.
- In the modes that compute collectives themselves (capture, slice's replay, emulate): a reduction prism's
  semantics does not define (PREMUL_SUM, NCCL's pre-multiplied sum), a reduction of float8 tensors and sparse
  tensors (`check_op`, at the op's issue: the earliest it can be known); torch's symmetric memory but async TP's
  fused ops (`symmetric_memory`: they run as torch's fallback there).

`record` (in the failing rank) and `finding` (in the supervisor) turn the error into one line of the
launcher's, exit code `EXIT_CODE`, rather than a rank's traceback. (torch is imported in the functions: the
zygote imports this module before torch, whose import installs the interception, which imports this module.)
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

EXIT_CODE = 2  # bad input: the program uses what prism cannot carry
CARRIED_BACKENDS = ("gloo", "nccl")
_ALSO_ACCEPTED = ("undefined", "prism")  # no backend named (torch's default), or prism's own name
_PRISM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class UnsupportedFeature(RuntimeError):
    """A feature of the program that prism cannot carry; the message names it, the rank and the fix."""


def this_rank() -> str:
    """This process's global rank, as the messages name it."""
    return os.environ.get("RANK", "0")


def uncarried(asked: str) -> list[str]:
    """The backends named in `asked` ("gloo", "cpu:gloo,cuda:nccl", "fake", ...) that prism does not carry."""
    names = [part.split(":", 1)[-1].strip() for part in asked.split(",") if part.strip()]
    return [n for n in names if n not in CARRIED_BACKENDS + _ALSO_ACCEPTED]


def check_backend(asked: str, desc: str | None, op: str | None = None) -> None:
    """Refuse a group on a backend but gloo and NCCL: the default group when it is made (everything goes
    through it), any other at its first op (`op`): a group made and never used is no error (torchtitan puts
    its size-1 and 'batch' mesh dimensions on the fake backend, which never communicate)."""
    unknown = uncarried(asked)
    if unknown:
        what = f"process group {desc!r}" if desc else "a process group"
        if op is not None:
            what = f"{op} on {what}, which"
        raise UnsupportedFeature(
            f"rank {this_rank()}: {what} asks for backend {asked!r}; prism intercepts only "
            f"{' and '.join(CARRIED_BACKENDS)} groups (it would replace {', '.join(map(repr, unknown))} by its "
            "own group and that backend would never run). Fix: create the group with backend='gloo' or "
            "'nccl' (or none: torch's default)")


def _caller() -> tuple[str, str]:
    """The frame outside torch that constructs a communicator, and the torch subsystem in between (if any)."""
    import torch

    frame = sys._getframe(2)
    via = ""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
        name = frame.f_code.co_filename
        if f"{os.sep}rpc{os.sep}" in name:
            via = "torch.distributed.rpc"
        elif not via and name.endswith("_dist2.py"):
            via = "torch.distributed._dist2"
        frame = frame.f_back
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    return where, via


def guard_direct_backends() -> None:
    """Make a `ProcessGroupGloo`/`ProcessGroupNCCL` built anywhere but in prism an `UnsupportedFeature`."""
    import torch.distributed as dist

    classes = [dist.ProcessGroupGloo] if dist.is_gloo_available() else []
    if dist.is_nccl_available():
        classes.append(dist.ProcessGroupNCCL)
    for cls in classes:
        if getattr(cls.__init__, "_prism_guard", False):
            continue
        original = cls.__init__

        def init(self, *args, _original=original, _cls=cls.__name__, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.startswith(_PRISM_DIR):
                where, via = _caller()
                if via == "torch.distributed.rpc":
                    what = ("torch.distributed.rpc (init_rpc) builds its own gloo group and sends its messages "
                            "over TensorPipe: neither goes through a process group prism intercepts")
                    fix = "use torch.distributed collectives or send/recv instead of RPC"
                else:
                    what = (f"a {_cls} built from its class{' by ' + via if via else ''}, not through "
                            "init_process_group/new_group: prism never sees its collectives (they would be "
                            "missing from the trace, and in capture its rendezvous would wait for ranks that "
                            "are not running)")
                    fix = "create the group with torch.distributed.new_group(backend='gloo')"
                raise UnsupportedFeature(f"rank {this_rank()}: {what} (at {where}). Fix: {fix}")
            _original(self, *args, **kwargs)

        init._prism_guard = True
        cls.__init__ = init


def check_op(op: str, group: str, tensors, args: tuple, reductions) -> None:
    """An op issued in a mode that computes collectives itself: its reduction and its tensors must be ones
    prism's semantics define (`reductions`: the reduce ops it folds; no float8 reduction, no sparse tensor)."""
    import torch
    import torch.distributed as dist

    from prism.runtime.ops import REDUCING

    kinds = (dist.AllreduceOptions, dist.AllreduceCoalescedOptions, dist.ReduceOptions, dist.ReduceScatterOptions)
    opts = next((a for a in args if isinstance(a, kinds)), None)
    if opts is not None:
        red = opts.reduceOp
        red = red.op if hasattr(red, "op") else red
        if red not in reductions:
            name = str(red).split(".")[-1]
            hint = (" (FSDP2 asks for it when a gradient divide factor is set: "
                    "`model.set_force_sum_reduction_for_comms(True)` keeps SUM)" if name == "PREMUL_SUM" else "")
            raise UnsupportedFeature(
                f"rank {this_rank()}: {op} with ReduceOp.{name} in group {group}: prism computes collectives itself "
                f"in this mode and defines {', '.join(str(r).split('.')[-1] for r in reductions)}, not "
                f"{name}{hint}. Fix: reduce with one of those")
    if op in REDUCING:
        tiny = next((t for t in tensors if isinstance(t, torch.Tensor) and t.dtype.is_floating_point
                     and t.dtype.itemsize == 1), None)
        if tiny is not None:
            name = str(tiny.dtype).removeprefix("torch.")
            raise UnsupportedFeature(
                f"rank {this_rank()}: {op} of a {name} tensor in group {group}: prism computes collectives itself in "
                f"this mode and folds with torch's add, which has no {name} kernel (nor does gloo reduce it). Fix: "
                "reduce in bfloat16 or float32 (float8 training frameworks all-gather float8 and reduce-scatter "
                "gradients in a wider type), or give the fused op a wider out_dtype")
    sparse = next((t for t in tensors if isinstance(t, torch.Tensor) and t.layout != torch.strided), None)
    if sparse is not None:
        raise UnsupportedFeature(
            f"rank {this_rank()}: {op} of a {str(sparse.layout).removeprefix('torch.')} tensor in group {group}: "
            "prism records and computes dense tensors only. Fix: communicate dense tensors (e.g. "
            "nn.Embedding(sparse=False), or `t.to_dense()` before the collective)")


def record(exc: BaseException, rank: int, status_dir: str | Path) -> bool:
    """In a failing rank: if `exc` is (or was caused by) an `UnsupportedFeature`, leave its message for the
    supervisor (`<status dir>/rank<R>.unsupported`) and return True."""
    found = exc
    while found is not None and not isinstance(found, UnsupportedFeature):
        found = found.__cause__ or found.__context__
    if found is None:
        return False
    text = str(found)
    if " (at " not in text:  # where in the program: its innermost frame outside torch and prism
        import torch

        skip = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, _PRISM_DIR)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)
                  and not f.filename.startswith("<")]
        if frames:
            text = text.replace(". Fix:", f" (at {frames[-1].filename}:{frames[-1].lineno}). Fix:", 1)
    path = Path(status_dir) / f"rank{rank}.unsupported"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def finding(status_dir: str | Path, rank: int) -> str | None:
    """The supervisor's one line for a rank that failed on an unsupported feature (None: it did not)."""
    path = Path(status_dir) / f"rank{rank}.unsupported"
    if not path.exists():
        return None
    return f"the program uses a feature prism cannot carry: {path.read_text()}"
