"""`prism bench pruning`: real emulations with pruning on and off — communicators, bytes moved, wall time.

For each workload layout and W: capture the tiny MoE workload (`prism launch --mode capture`, P=2), then
run `prism launch --mode emulate` of one sandbox rank twice, pruning on and `--no-pruning` (no calibration:
the replay is untimed, so the wall time is the exchange's, not a calibrated clock's). Prints per run the
communicators created (sandbox's and worker's), the tensor bytes moved through the transport (collectives
and point-to-point, both directions: `raw/meta.json` `emulation.bytes_moved`) and the launch's wall time,
and the on/off ratios. The sandbox's printed losses and gradient norms must be identical on and off
(the bench fails otherwise).

    prism bench pruning [--sizes 8,16] [--layouts tp,pp] [--steps 2] [--work DIR]
    prism bench pruning --protocol [--sizes 2,4,8,16,32,64] [--sandbox 1,2,3]

`--protocol` prints instead, without running anything, the bytes one group's all-reduce moves in units
of the tensor size S, from the protocol executed in one process (`prism.runtime.emulate.pruned.PrunedGroup`):
ring (a full ring all-reduce among all n members, 2(n-1) S), chain (the pruned protocol), gather (each
sandbox member folding everything itself: only the leading run can be pre-folded).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from prism import job as job_files
from prism.bench import text_table
from prism.runtime import semantics
from prism.runtime.emulate.pruned import PrunedGroup, individual_all_reduce_bytes, ring_all_reduce_bytes
from prism.runtime.semantics import RedOp

SMALL = ["--micro-batch-size", "1", "--seq-len", "16", "--hidden", "32", "--ffn-hidden", "32", "--heads", "2",
         "--kv-heads", "2", "--vocab", "64"]


def layout(name: str, w: int) -> tuple[str, list[str], int]:
    """(label, workload arguments, sandbox rank) of a layout at W: the layouts of the emulate-mode tests
    with dp grown to fill W; the sandbox is a rank that prints the loss (tp 0 of the last stage)."""
    if name == "tp":
        dp = w // 2
        return f"tp2-dp{dp}-ep2", ["--tp", "2", "--dp", str(dp), "--ep", "2"], 0
    if name == "pp":
        dp = w // 2
        return f"pp2-dp{dp}-mb4-varseq", ["--pp", "2", "--dp", str(dp), "--microbatches", "4", "--var-seq"], w // 2
    raise ValueError(name)


STEP = re.compile(r"step=(\d+) (loss|grad_norm)=(\S+)")


def _launch(args: list[str], what: str) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "prism.cli", "launch", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.monotonic() - start, proc.stdout + proc.stderr


def measure(name: str, w: int, steps: int, work: Path) -> dict:
    label, args, sandbox = layout(name, w)
    prog = ["-m", "prism.workloads.moe_gpt", *args, *SMALL, "--steps", str(steps)]
    job = work / f"{label}-w{w}"
    _launch(["--nproc", str(w), "--mode", "capture", "--devices", "2", "--out", str(job_files.capture_dir(job)), *prog],
            f"capture of {label} at W={w}")
    row = {"layout": label, "W": w, "sandbox": sandbox}
    printed = {}
    for on in (True, False):
        out = job / ("on" if on else "off")
        wall, text = _launch(["--nproc", str(w), "--mode", "emulate", "--capture", str(job_files.capture_dir(job)),
                              "--sandbox", str(sandbox), "--devices", "1", *([] if on else ["--no-pruning"]),
                              "--out", str(out), *prog], f"emulation of {label} at W={w} (pruning {on})")
        emu = json.loads(job_files.meta_path(out).read_text())["emulation"]
        key = "on" if on else "off"
        row.update({f"{key}_communicators": emu["communicators"], f"{key}_bytes": emu["bytes_moved"],
                    f"{key}_wall_s": wall})
        printed[key] = sorted(STEP.findall(text))
    if printed["on"] != printed["off"] or not printed["on"]:
        raise RuntimeError(f"{label} at W={w}: the sandbox printed different losses with pruning on and off:\n"
                           f"{printed['on']}\n{printed['off']}")
    return row


EMULATION_COLUMNS: list[text_table.Column] = [
    ("layout", "<22", lambda r: r["layout"]), ("W", ">3", lambda r: r["W"]), ("sandbox", ">7", lambda r: r["sandbox"]),
    text_table.SEP,
    ("comms on", ">8", lambda r: r["on_communicators"]), ("comms off", ">9", lambda r: r["off_communicators"]),
    text_table.SEP,
    ("bytes on", ">12,", lambda r: r["on_bytes"]), ("bytes off", ">12,", lambda r: r["off_bytes"]),
    ("on/off", ">6.3f", lambda r: r["on_bytes"] / r["off_bytes"]),
    text_table.SEP,
    ("wall on s", ">9.1f", lambda r: r["on_wall_s"]), ("wall off s", ">10.1f", lambda r: r["off_wall_s"]),
    ("on/off", ">6.2f", lambda r: r["on_wall_s"] / r["off_wall_s"]),
]


def emulation_table(rows: list[dict], steps: int) -> str:
    return text_table.render(f"prism bench pruning: one sandbox rank, tiny MoE model, {steps} steps, capture on P=2, "
                             "untimed replay", EMULATION_COLUMNS, rows)


# -- --protocol: one group's all-reduce, from the protocol alone ------------------------------------------------
def placements(n: int, s: int) -> dict[str, list[int]]:
    return {"first": list(range(s)),
            "spread": sorted({(i * n) // s + (n // s) // 2 for i in range(s)}),
            "last": list(range(n - s, n))}


def row(n: int, s: int, where: str, sandbox: list[int]) -> dict:
    members = list(range(n))
    g = torch.Generator().manual_seed(n * 100 + s)
    xs = [torch.randn(1, generator=g) for _ in members]
    group = PrunedGroup(members, set(sandbox))
    out = group.all_reduce(RedOp.SUM, {m: xs[m] for m in sandbox}, {m: xs[m] for m in members if m not in sandbox})
    want = semantics.reduce(xs, RedOp.SUM)
    assert all(torch.equal(t, want) for t in out.values()), (n, sandbox)
    size = xs[0].numel() * xs[0].element_size()
    return dict(n=n, s=s, placement=where, participants=len(group.participants),
                ring=ring_all_reduce_bytes(n, size) // size, chain=group.bytes_moved() // size,
                gather=individual_all_reduce_bytes(members, set(sandbox), size) // size)


PROTOCOL_COLUMNS: list[text_table.Column] = [
    ("n", ">4", lambda r: r["n"]), ("s", ">2", lambda r: r["s"]), ("placement", ">9", lambda r: r["placement"]),
    ("participants", ">12", lambda r: r["participants"]), ("ring", ">6", lambda r: r["ring"]),
    ("chain", ">6", lambda r: r["chain"]), ("gather", ">7", lambda r: r["gather"]),
    ("chain/ring", ">10.3f", lambda r: r["chain"] / r["ring"]),
]


def protocol_table(sizes: list[int], counts: list[int]) -> None:
    print(text_table.header(PROTOCOL_COLUMNS) + "   (bytes in units of the tensor size S)")
    for n in sizes:
        for s in counts:
            if s > n:
                continue
            for where, sandbox in placements(n, s).items():
                print(text_table.line(PROTOCOL_COLUMNS, row(n, s, where, sandbox)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prism bench pruning", description=__doc__.split("\n")[0])
    p.add_argument("--protocol", action="store_true", help="one group's all-reduce from the protocol alone")
    p.add_argument("--sizes", default=None, help="W (default 8,16), or with --protocol group sizes n "
                                                "(default 2,4,8,16,32,64)")
    p.add_argument("--sandbox", default="1,2,3", help="--protocol: numbers of sandbox members s")
    p.add_argument("--layouts", default="tp,pp", help="tp (tp2-dpX-ep2) and/or pp (pp2-dpX-mb4-varseq)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--work", default=None, help="folder for the jobs (default: a temporary one, removed)")
    args = p.parse_args(argv)
    try:
        sizes = [int(v) for v in (args.sizes or ("2,4,8,16,32,64" if args.protocol else "8,16")).split(",")]
        counts = [int(v) for v in args.sandbox.split(",")]
    except ValueError:
        p.error("--sizes and --sandbox take comma-separated integers, e.g. --sizes 2,8 --sandbox 1,2")
    if args.protocol:
        if any(n < 2 for n in sizes) or any(s < 1 for s in counts):
            p.error("group sizes must be >= 2 and sandbox counts >= 1")
        protocol_table(sizes, counts)
        return 0
    names = [v.strip() for v in args.layouts.split(",") if v.strip()]
    if any(n not in ("tp", "pp") for n in names) or any(w < 4 or w % 4 for w in sizes):
        p.error("--layouts takes tp and/or pp; --sizes multiples of 4 (tp2/pp2 with dp divisible by ep 2)")
    with tempfile.TemporaryDirectory(prefix="prism-bench-pruning-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        rows = []
        for w in sizes:
            for name in names:
                rows.append(measure(name, w, args.steps, work))
                print(emulation_table(rows[-1:], args.steps).splitlines()[-1], file=sys.stderr, flush=True)
    print(emulation_table(rows, args.steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
