"""Issue 22, before and after, on a job folder: .venv/bin/python scripts/timeline_checks.py JOB [OLD_REF]

Prints two tables: the emulation's events overlapping per rank, as the emulate stage placed them before
(computed rows at the substituted sweep's times, re-swept here from the sandbox rows of JOB/emulation) and now
(`prism.emulate.outputs.one_clock`); and per timeline, the Perfetto and Kineto exports' flows, backward flows and
Trace Event Format problems (tests/tef.py) with OLD_REF's prism/report/export.py (default s9move) and this one.
"""
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from prism import schemas
from prism.calibrate import substitute
from prism.calibrate.stage import load_graph
from prism.report import export as new_export
from prism.report.data import load_timeline
from tests.tef import problems

J = sys.argv[1]
OLD = sys.argv[2] if len(sys.argv) > 2 else "s9move"
old_file = Path(tempfile.mkdtemp()) / "old_export.py"
old_file.write_text(subprocess.run(["git", "show", f"{OLD}:prism/report/export.py"], cwd=REPO, check=True,
                                   capture_output=True, text=True).stdout)
spec = importlib.util.spec_from_file_location("old_export", old_file)
old_export = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_export)

# the emulation as the old build placed it: computed rows at the substituted sweep's times
ev = pq.read_table(f"{J}/emulation/events.parquet").sort_by([("rank", "ascending"), ("seq", "ascending")])
job = load_graph(J)
dur, xfer, _ = substitute.calibrated_inputs(J, job)
src = np.array(ev["source"].cast(pa.string()).to_pylist())
sb = np.flatnonzero(src == "sandbox")
col = {c: ev[c].to_numpy()[sb] for c in ("device_ns", "cpu_ns", "t_start_ns", "t_end_ns", "t_complete_ns")}
d = substitute.substitute_measured(job, dur, sb, col["device_ns"], col["t_start_ns"], col["t_end_ns"],
                                   col["t_complete_ns"], cpu_ns=col["cpu_ns"])
sw = substitute.sweep(job, d, xfer)
start, end = ev["start_ns"].to_numpy().copy(), ev["end_ns"].to_numpy().copy()
comp = src == "computed"
start[comp], end[comp] = sw.start_ns[comp], sw.end_ns[comp]
rank, seq = ev["rank"].to_numpy(), ev["seq"].to_numpy()

def overlaps(start, end):
    same = rank[1:] == rank[:-1]
    o = np.flatnonzero(same & (start[1:] < end[:-1]))
    return len(o), (int((end[:-1] - start[1:])[o].max()) / 1e6 if len(o) else 0.0)

print("| emulation events | overlapping events | largest overlap ms |")
print("|---|---|---|")
for name, (s, e) in (("old (computed rows on the sweep's clock)", (start, end)),
                     ("new (one_clock)", (ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()))):
    n, mx = overlaps(s, e)
    print(f"| {name} | {n} | {mx:.2f} |")

print()
print("| timeline | export | flows | backward flows | TEF problems (first) |")
print("|---|---|---|---|---|")
for tl in ("capture", "calibrated", "baseline", "emulation"):
    t = load_timeline(J, tl)
    for name, trace in (("old", old_export.perfetto(t)), ("new", new_export.perfetto(t, new_export.group_names(J, tl)))):
        ev_ = trace["traceEvents"]
        s = {e["id"]: e for e in ev_ if e["ph"] == "s"}
        f = {e["id"]: e for e in ev_ if e["ph"] == "f"}
        back = sum(f[i]["ts"] < s[i]["ts"] - 0.0005 for i in s)
        p = problems(trace, limit=1000)
        print(f"| {tl} | perfetto {name} | {len(s)} | {back} | {len(p)}: {p[0][:90] if p else '-'} |")
    for name, mod in (("old", old_export), ("new", new_export)):
        probs = []
        for r in range(t.world):
            trace = mod.kineto(t, r) if name == "old" else mod.kineto(t, r, new_export.group_names(J, tl))
            probs += problems(trace, strict_tracks=lambda pid, tid: tid >= 7, limit=1000)
        print(f"| {tl} | kineto {name} | - | - | {len(probs)}: {probs[0][:90] if probs else '-'} |")
