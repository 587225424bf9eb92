"""The emulated sandbox's gap against its prediction, term by term, for the bench's own rank of every run
(issue 24 item 3; session 19). Uses `scripts/fidelity_sandbox_gap.decompose` on each prism run of each config
folder of the bench's files, the rank the bench scored (`fidelity.json` `emulated[i].rank`, the last stage's),
the run's variant (`--variant none`: the pipeline's defaults only). Terms in % of the rank's predicted mean
iteration (ms/it over the mean), so that they add up to the mean gap:

    gap = compute + issues + markers + waits' model part + waits' excess (by op kind)

and, beside, the emulate stage's own split (program - predicted, delay = measured - program; medians) and the
compute's CPU against the slice run's CPU for the same events.

    .venv/bin/python scripts/fidelity_sandbox_terms.py [--variant none] F/call1/a/fidelity.json ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_sandbox_gap import decompose  # noqa: E402


def runs(paths: list[Path], variant: str):
    for path in paths:
        for c in json.loads(path.read_text()):
            labels = list(c.get("variant") or []) or ["none"] * len(c.get("emulated") or [])
            for i, em in enumerate(c.get("emulated") or []):
                label = labels[i] if i < len(labels) else "none"
                if variant != "all" and label != variant:
                    continue
                if not em or em.get("sandbox_ms") is None:
                    continue
                job = path.parent / c["config"] / f"prism{i}"
                if (job / "emulation" / "meta.json").exists():
                    yield path, c, i, label, em, job


def main(argv: list[str]) -> int:
    variant = "none"
    if "--variant" in argv:
        at = argv.index("--variant")
        variant = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    paths = [Path(a) for a in argv]
    cols = ["bench gap %", "gap (mean) %", "compute", "issues", "markers", "model", "excess", "program-pred",
            "delay", "CPU/slice CPU"]
    print("| call/stream | config | run | variant | rank (sandbox) | " + " | ".join(cols) + " | excess by op |")
    print("|" + "---|" * (6 + len(cols)))
    acc: dict[str, list[float]] = {k: [] for k in cols}
    for path, c, i, label, em, job in runs(paths, variant):
        d = decompose(job, rank=int(em["rank"]))
        t = d["terms"]
        pm = d["predicted_mean_ms"]
        pc = lambda v: 100.0 * v / pm  # noqa: E731
        model = sum(v for k, v in t.items() if k.endswith(" model"))
        excess = {k[5:-7]: v for k, v in t.items() if k.endswith(" excess")}
        pr, me, prog = d["predicted_median_ms"], d["measured_median_ms"], d["program_median_ms"]
        ratio = t.get("compute cpu", 0) / t["slice compute cpu"] if t.get("slice compute cpu") else float("nan")
        vals = {"bench gap %": 100 * (em["sandbox_ms"] / em["pred_rank_ms"] - 1),
                "gap (mean) %": pc(d["measured_mean_ms"] - pm), "compute": pc(t.get("compute", 0)),
                "issues": pc(t.get("issues", 0)), "markers": pc(t.get("markers", 0)), "model": pc(model),
                "excess": pc(sum(excess.values())), "program-pred": 100 * (prog - pr) / pr,
                "delay": 100 * (me - prog) / pr, "CPU/slice CPU": ratio}
        for k, v in vals.items():
            acc[k].append(v)
        ex = ", ".join(f"{o} {pc(v):+.1f}" for o, v in sorted(excess.items(), key=lambda kv: -abs(kv[1]))
                       if abs(pc(v)) >= 0.05)
        name = "/".join(path.parent.parts[-2:])
        print(f"| {name} | {c['config']} | {i} | {label} | {em['rank']} ({','.join(map(str, d['sandbox']))}) | "
              + " | ".join(f"{vals[k]:.3f}" if k == "CPU/slice CPU" else f"{vals[k]:+.1f}" for k in cols)
              + f" | {ex} |")
    n = len(acc["compute"])
    print(f"| mean of {n} | | | | | " + " | ".join(
        (f"{statistics.mean(v):.3f}" if k == "CPU/slice CPU" else f"{statistics.mean(v):+.1f}") if v else "-"
        for k, v in acc.items()) + " | |")
    print(f"| mean \\|.\\| of {n} | | | | | " + " | ".join(
        (f"{statistics.mean(abs(x - 1) for x in v):.3f}" if k == "CPU/slice CPU" else
         f"{statistics.mean(abs(x) for x in v):.1f}") if v else "-" for k, v in acc.items()) + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
