"""The emulate stage's "program" (the calibrate sweep with the sandbox's measured durations substituted) by two
rules for the sandbox's compute: the bare-graph rule `substitute.substitute_measured` used (compute = its device
time, on CPU the thread's CPU time) and the measured-run rule the calibration took the slices' compute by
(`durations.measured_run`: the longer of the wall span and the device time). Per prism run of the bench files
(the bench's rank), the median iteration (ms) of: the prediction, the measured sandbox, the program by each
rule, and the delay (measured - program) by each (issue 24 item 3; session 19).

    .venv/bin/python scripts/sandbox_program_rule.py [--variant none] F/call1/a/fidelity.json ...
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_sandbox_terms import runs  # noqa: E402

from prism.calibrate import substitute  # noqa: E402
from prism.calibrate.arrays import K_COMPUTE  # noqa: E402
from prism.emulate import results  # noqa: E402
from prism.job import iterations_table, load_graph  # noqa: E402


def programs(job_dir: Path, rank: int) -> dict[str, float]:
    job = load_graph(job_dir)
    durations, transfers, _ = substitute.calibrated_inputs(job_dir, job)
    ev = pq.read_table(job_dir / "emulation" / "events.parquet",
                       columns=["rank", "seq", "source", "device_ns", "cpu_ns", "t_start_ns", "t_end_ns",
                                "t_complete_ns"]).to_pydict()
    sel = [i for i, s in enumerate(ev["source"]) if s == "sandbox"]
    ptr = job.graph.rank_ptr
    rows = np.array([ptr[ev["rank"][i]] + ev["seq"][i] for i in sel], dtype=np.int64)
    col = {k: np.array([ev[k][i] for i in sel], dtype=np.int64) for k in
           ("device_ns", "cpu_ns", "t_start_ns", "t_end_ns", "t_complete_ns")}
    out = {}
    base = substitute.substitute_measured(job, durations, rows, col["device_ns"], col["t_start_ns"], col["t_end_ns"],
                                          col["t_complete_ns"], cpu_ns=col["cpu_ns"])
    span = col["t_end_ns"] - col["t_start_ns"]
    compute = job.graph.kind[rows] == K_COMPUTE
    wall = base.copy()
    wall[rows[compute]] = np.maximum(span[compute], base[rows[compute]])
    calib = pq.read_table(job_dir / "calibrated" / "iterations.parquet")
    emu = pq.read_table(job_dir / "emulation" / "iterations.parquet")
    keep = results.compared_iterations(emu)
    sandbox = results._of_rank(results._of_source(emu, "sandbox"), rank)
    out["predicted"] = results.median_ms(results.job_iteration_ns(results._of_rank(calib, rank), keep))
    out["measured"] = results.median_ms(results.job_iteration_ns(sandbox, keep))
    for name, dur in (("program cpu", base), ("program wall", wall)):
        it = iterations_table(job, substitute.sweep(job, dur, transfers))
        out[name] = results.median_ms(results.job_iteration_ns(results._of_rank(it, rank), keep))
    return out


def main(argv: list[str]) -> int:
    variant = "none"
    if "--variant" in argv:
        at = argv.index("--variant")
        variant = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    print("| call/stream | config | run | rank | predicted ms | measured ms | gap % | program (CPU rule) - pred % | "
          "delay % | program (wall rule) - pred % | delay % | emulate stage's program - pred % |")
    print("|" + "---|" * 12)
    acc = {k: [] for k in ("gap", "pc", "dc", "pw", "dw")}
    for path, c, i, label, em, job in runs([Path(a) for a in argv], variant):
        p = programs(job, int(em["rank"]))
        pr = p["predicted"]
        v = {"gap": 100 * (p["measured"] - pr) / pr, "pc": 100 * (p["program cpu"] - pr) / pr,
             "dc": 100 * (p["measured"] - p["program cpu"]) / pr, "pw": 100 * (p["program wall"] - pr) / pr,
             "dw": 100 * (p["measured"] - p["program wall"]) / pr}
        for k in acc:
            acc[k].append(v[k])
        stage = 100 * (em["computed_rank_ms"] - em["pred_rank_ms"]) / em["pred_rank_ms"]
        print(f"| {'/'.join(path.parent.parts[-2:])} | {c['config']} | {i} | {em['rank']} | {pr:.2f} | "
              f"{p['measured']:.2f} | {v['gap']:+.1f} | {v['pc']:+.1f} | {v['dc']:+.1f} | {v['pw']:+.1f} | "
              f"{v['dw']:+.1f} | {stage:+.1f} |")
    n = len(acc["gap"])
    print(f"| mean of {n} | | | | | | " + " | ".join(f"{statistics.mean(acc[k]):+.1f}" for k in acc) + " | |")
    print(f"| mean \\|.\\| | | | | | | " + " | ".join(f"{statistics.mean(abs(x) for x in acc[k]):.1f}" for k in acc)
          + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
