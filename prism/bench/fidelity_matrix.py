"""The fidelity matrix of one method, from several bench files: issue 24 item 4's table and goals.

    python -m prism.bench.fidelity_matrix [--variant none] F/a/fidelity.json F/b/fidelity.json ...

Per config (each once; a config in two files is an error naming both): the truth runs (median, min-max), the
prism runs of `--variant` only (`none`: the pipeline's defaults; an `--alternate` call's other runs are left
out), their median as the config's prediction, its error against the truths' median and whether it lies inside
the truths' spread, every run's own error; the emulated sandbox of each such run against its own prediction
(the calibrated timeline's iteration time of that rank, `pred_rank_ms`) and against the truths' median of that
rank. Then the goals of item 4: mean signed error, mean |error|, configs inside the spread, the sandbox's mean
|error| against the truth's rank and against its prediction (item 3's ±2 %). Nothing here feeds a prediction.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from prism.bench.fidelity_sandbox import truth_rank
from prism.bench.fidelity_table import ResultsError, read_json


def _pct(value: float, truth: float) -> float:
    return 100.0 * (value - truth) / truth


def _join(values) -> str:
    return ", ".join("-" if v is None else f"{v:+.1f}" for v in values) or "-"


def config_rows(results, variant: str) -> list[dict]:
    rows = []
    for r in results:
        if not r.ok:
            rows.append({"config": r.cfg.name, "error": r.error or "failed"})
            continue
        labels = list(r.variant) or ["none"] * len(r.pred_ms)
        labels += ["none"] * (len(r.pred_ms) - len(labels))
        runs = [i for i, label in enumerate(labels) if label == variant]
        if not runs:
            continue
        truth = statistics.median(r.truth_ms)
        preds = [r.pred_ms[i] for i in runs]
        pred = statistics.median(preds)
        sandbox = []
        for i in runs:
            em = r.emulated[i] if i < len(r.emulated) else None
            if not em or em.get("error") or em.get("sandbox_ms") is None:
                continue
            tr = truth_rank(r, int(em["rank"]))
            sandbox.append({"rank": int(em["rank"]), "vs_pred": _pct(em["sandbox_ms"], em["pred_rank_ms"]),
                            "vs_truth": _pct(em["sandbox_ms"], statistics.median(tr)) if tr else None})
        rows.append({"config": r.cfg.name, "world": r.cfg.world, "truths": len(r.truth_ms), "truth": truth,
                     "lo": min(r.truth_ms), "hi": max(r.truth_ms), "runs": len(preds), "pred": pred,
                     "error": None, "err": _pct(pred, truth), "inside": min(r.truth_ms) <= pred <= max(r.truth_ms),
                     "run_errs": [_pct(p, truth) for p in preds], "sandbox": sandbox})
    return rows


def report(paths: list[Path], variant: str = "none") -> list[str]:
    seen: dict[str, Path] = {}
    rows = []
    for path in paths:
        for row in config_rows(read_json(path), variant):
            if row["config"] in seen:
                raise ResultsError(f"{row['config']} is in both {seen[row['config']]} and {path}: give each "
                                   "config's file once")
            seen[row["config"]] = path
            rows.append(row)
    lines = [f"runs of variant {variant!r}; error: the runs' median against the truths' median",
             "", "| config | W | truths | truth ms (min-max) | prism runs | prism ms | error % | inside | each run's "
             "error % | sandbox vs its prediction % | sandbox vs the truth's rank % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    good = [r for r in rows if r.get("error") is None]
    for r in rows:
        if r.get("error") is not None:
            lines.append(f"| {r['config']} | FAILED: {str(r['error'])[:120]} |")
            continue
        sb = r["sandbox"]
        lines.append(
            f"| {r['config']} | {r['world']} | {r['truths']} | {r['truth']:.2f} ({r['lo']:.2f}-{r['hi']:.2f}) | "
            f"{r['runs']} | {r['pred']:.2f} | {r['err']:+.1f} | {'yes' if r['inside'] else 'no'} | "
            f"{_join(r['run_errs'])} | "
            f"{_join(s['vs_pred'] for s in sb)} | {_join(s['vs_truth'] for s in sb)} |")
    if good:
        errs = [r["err"] for r in good]
        sb = [s for r in good for s in r["sandbox"]]
        vs_pred = [s["vs_pred"] for s in sb]
        vs_truth = [s["vs_truth"] for s in sb if s["vs_truth"] is not None]
        lines += ["", f"configs {len(good)} (of them failed: {len(rows) - len(good)}); mean signed error "
                  f"{statistics.mean(errs):+.1f} % (goal within ±1), mean |error| "
                  f"{statistics.mean(abs(e) for e in errs):.1f} % (goal <= 3), inside the truth's spread "
                  f"{sum(r['inside'] for r in good)} of {len(good)} (goal >= 13 of 16); every run: mean |error| "
                  f"{statistics.mean(abs(e) for r in good for e in r['run_errs']):.1f} % over "
                  f"{sum(r['runs'] for r in good)} runs"]
        if sb:
            lines.append(f"emulated sandbox ({len(sb)} runs): vs its prediction mean {statistics.mean(vs_pred):+.1f} %, "
                         f"mean |.| {statistics.mean(abs(v) for v in vs_pred):.1f} %, within ±2 %: "
                         f"{sum(abs(v) <= 2 for v in vs_pred)} of {len(vs_pred)}; vs the truth's rank mean |.| "
                         + (f"{statistics.mean(abs(v) for v in vs_truth):.1f} % (goal <= 3), within ±3 %: "
                            f"{sum(abs(v) <= 3 for v in vs_truth)} of {len(vs_truth)}" if vs_truth else "-"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_matrix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", type=Path, nargs="+", metavar="FIDELITY_JSON")
    parser.add_argument("--variant", default="none", help="the prism runs scored (a bench variant label)")
    args = parser.parse_args(argv)
    try:
        print("\n".join(report(args.files, args.variant)))
    except ResultsError as exc:
        print(f"fidelity_matrix: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
