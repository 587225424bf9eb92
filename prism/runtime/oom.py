"""A per-rank device-memory limit, and an out-of-memory error reported as a finding, not as a crash.

`prism launch --rank-memory-gb G` models a smaller card: every rank's caching allocator may hold at most G
GiB (`torch.cuda.set_per_process_memory_fraction(G GiB / the device's total)`, set in the rank after the
fork, on its device `LOCAL_RANK % device_count`). The allocator refuses a request when what it already
reserved plus the request would pass the limit (after releasing its cached blocks): a CUDA out-of-memory
error, deterministic for a given program and limit, so capture meets it where the real run does.

When a rank runs out of device memory, the allocator's out-of-memory observer records what it was asked
for (the exact block size in bytes) and where the rank was: iteration, microbatch and the last marker
(`fwd_begin`, `bwd_begin`, ...; the microbatch is that marker's, so a backward's OOM names the microbatch
being backpropagated). The rank then fails with exit code `EXIT_CODE`, the supervisor says plainly that the
program ran out of memory under the limit (a finding about the program, not a failure of prism) and exits
`EXIT_CODE`, and the launcher writes `OUT/oom.json` (every rank's record, `write_finding`). Without the
observer (an older torch, a CPU-only test), the size comes from the error's "Tried to allocate" text.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from prism import settings

ENV = settings.RANK_MEMORY_BYTES.name
EXIT_CODE = 87  # a rank ran out of device memory (documented in docs/gpu.md and `prism launch --help`)
FINDING = "oom.json"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_seen: dict = {}  # the observer's record in this rank (first OOM only)


def limit_bytes(gb: float) -> int:
    if not gb > 0:
        raise ValueError(f"--rank-memory-gb must be positive (got {gb})")
    return int(gb * 2**30)


def apply_limit() -> int | None:
    """In a rank, after the fork: cap the caching allocator at $PRISM_RANK_MEMORY_BYTES on the rank's device
    and watch for out-of-memory errors. Returns the limit (None when none was asked)."""
    limit = settings.RANK_MEMORY_BYTES.get()
    if not limit:
        return None
    import torch

    if not torch.cuda.is_available():
        _refuse("--rank-memory-gb limits a rank's CUDA memory, but this rank sees no CUDA device; "
                "drop --rank-memory-gb or run on a GPU host")
    device = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    total = torch.cuda.get_device_properties(device).total_memory
    if limit > total:
        _refuse(f"--rank-memory-gb {limit / 2**30:g} exceeds the device's {total / 2**30:.2f} GiB; "
                "pick a smaller limit")
    torch.cuda.set_per_process_memory_fraction(limit / total, device)
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None:
        attach(_observe)
    return limit


def _refuse(why: str) -> None:
    import sys

    sys.stderr.write(f"prism: error: {why}\n")
    sys.stderr.flush()
    raise SystemExit(2)


_recorder = [lambda: None]  # the rank's recorder, as the interception tells it (`locate_with`)


def locate_with(recorder) -> None:
    """Say where a failure happened from `recorder()` (the interception's: the rank's `Recorder` or None)."""
    _recorder[0] = recorder


def _where() -> dict:
    rec = _recorder[0]()
    if rec is None:
        return {"iteration": -1, "microbatch": -1, "phase": None}
    op, microbatch = rec.last_marker
    return {"iteration": rec.iteration, "microbatch": microbatch, "phase": op}


def _observe(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """The caching allocator's out-of-memory observer (called before it raises)."""
    if _seen:
        return
    import torch

    _seen.update(_where(), device=int(device), requested_bytes=int(alloc), limit_bytes=int(device_allocated),
                 allocated_bytes=torch.cuda.memory_allocated(device),
                 reserved_bytes=torch.cuda.memory_reserved(device), size_from="allocator")


def requested_from_message(text: str) -> int | None:
    """The size in a CUDA out-of-memory message ("Tried to allocate 20.00 MiB"), in bytes (rounded as printed)."""
    m = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", text)
    return None if m is None else round(float(m.group(1)) * _UNITS[m.group(2)])


def record_failure(exc: BaseException, rank: int, status_dir: str | Path) -> bool:
    """In a failing rank: if `exc` is a device out-of-memory error, write its record for the supervisor
    (`<status dir>/rank<R>.oom.json`) and return True."""
    try:
        import torch
    except ImportError:
        return False
    if not isinstance(exc, torch.OutOfMemoryError):
        return False
    rec = dict(_seen) if _seen else dict(_where(), requested_bytes=requested_from_message(str(exc)),
                                          size_from="message")
    rec.setdefault("limit_bytes", settings.RANK_MEMORY_BYTES.get() or None)
    rec.update(rank=rank, message=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
    path = Path(status_dir) / f"rank{rank}.oom.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)
    return True


def records(status_dir: str | Path) -> list[dict]:
    """Every rank's out-of-memory record in the run's status folder, by rank."""
    found = [json.loads(p.read_text()) for p in Path(status_dir).glob("rank*.oom.json")]
    return sorted(found, key=lambda r: r["rank"])


def describe(rec: dict) -> str:
    """One plain sentence about one rank's out-of-memory error."""
    size = rec.get("requested_bytes")
    asked = f"{size:,} bytes ({size / 2**20:.2f} MiB)" if size is not None else "an unknown size"
    limit = rec.get("limit_bytes")
    under = f" under a limit of {limit / 2**30:.3f} GiB per rank" if limit else ""
    where = (f"iteration {rec['iteration']}, microbatch {rec['microbatch']} (after {rec['phase']})"
             if rec.get("iteration", -1) >= 0 else "before the first recorded iteration")
    return f"rank {rec['rank']} ran out of device memory{under} at {where}, asking for {asked}"


def finding(status_dir: str | Path) -> str | None:
    """The supervisor's message when ranks ran out of memory (None if none did)."""
    recs = records(status_dir)
    if not recs:
        return None
    return ("the program ran out of device memory: " + "; ".join(describe(r) for r in recs) + ". This is a "
            "finding about the program under this memory limit, not a failure of prism "
            f"(exit code {EXIT_CODE}; details in OUT/{FINDING}).")


def write_finding(status_dir: str | Path, out: Path, meta: dict) -> Path | None:
    """The launcher, after an out-of-memory exit: `OUT/oom.json` (written to a temporary name, renamed)."""
    recs = records(status_dir)
    if not recs:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / FINDING
    tmp = out / f".{FINDING}.tmp"
    tmp.write_text(json.dumps(dict(meta, exit_code=EXIT_CODE, ooms=recs), indent=2) + "\n")
    os.replace(tmp, path)
    return path
