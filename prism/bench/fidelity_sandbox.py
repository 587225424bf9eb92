"""The fidelity bench's emulated sandbox and first-pass prediction: metrics and their table.

Per prism run the bench also runs ``prism emulate`` on the calibrated job with the sandbox of
`sandbox_ranks` (the stage's default rank, a rank of the last pipeline stage, and by default the rest of its
slice) and records for the default rank, beside the prediction and the truth:

- ``sandbox_ms``: the sandbox rank's own iteration time in the emulation (the median over k >= 1 of the gaps
  between its consecutive ``iteration_end`` markers: `rank_iteration_ms` on the emulation's 'sandbox' rows);
- ``job_ms``: the emulated job's iteration time (`prism.iterations` on the emulation's 'computed' rows: the
  calibrated sweep with the sandbox's measured durations substituted);
- ``pred_rank_ms``: the same rank's iteration time in the calibrated timeline (the prediction, per rank);
- ``events``: `sandbox_event_errors`, the sandbox rank's events against the first truth run's events of the
  same rank, and the calibrated timeline's events of that rank against the same truth, matched by seq.

The truth side: every truth run's per-rank iteration times (``truth_rank_ms``, `rank_iteration_ms`), so the
sandbox rank's truth is the median (spread: min-max) over truth runs of that rank's time.

``pred_untimed_ms``: the first pass's prediction (calibrated from untimed slice runs, `calibrated_untimed/`);
``pred_ms`` is then the final one (slices timed by that first calibration, `calibrated/`).
"""

from __future__ import annotations

import statistics

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from prism import job as job_files
from prism.bench.fidelity_score import _strings
from prism.emulate import results as emulation_results
from prism.emulate.sandbox import resolve
from prism.iterations import iteration_times


def sandbox_ranks(job: Path, whole_slice: bool) -> list[int]:
    """The bench's sandbox: `prism emulate`'s default rank (one rank of the last pipeline stage) first, then,
    with `whole_slice`, the other ranks of its slice in JOB/slices/plan.parquet (ascending), so that the
    sandbox fills the P device slots as a slice run does."""
    default = resolve(None, pq.read_table(job_files.graph_file(job, "ranks")))[0]
    if not whole_slice:
        return [default]
    plan = pq.read_table(job_files.slice_plan(job), columns=["rank", "slice"]).to_pydict()
    of = dict(zip(plan["rank"], plan["slice"]))
    return [default] + sorted(r for r, k in of.items() if k == of[default] and r != default)


def rank_iteration_ms(rank, iteration, end_ns, world: int) -> list[float | None]:
    """Each rank's own iteration time (ms): the median over k >= 1 of its end(k) - end(k-1), from parallel
    per-marker arrays (rank, iteration, end); None for a rank with fewer than two iterations."""
    rank = np.asarray(rank, dtype=np.int64)
    iteration = np.asarray(iteration, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    out: list[float | None] = []
    for r in range(world):
        sel = rank == r
        times = iteration_times(iteration[sel], end_ns[sel])
        out.append(None if times is None else times.median_ms)
    return out


def _durations(seq, iteration, start, end) -> dict[int, tuple[int, int]]:
    return {int(s): (int(i), int(e) - int(b)) for s, i, b, e in zip(seq, iteration, start, end)}


def _abs_stats(diffs: list[float]) -> tuple[float, float]:
    if not diffs:
        return float("nan"), float("nan")
    return float(np.median(diffs)), float(np.percentile(diffs, 95))


def sandbox_event_errors(truth: dict, sandbox: dict, pred: dict, compute: set[int]) -> dict:
    """Per-event duration errors of one rank after its iteration 0, against the truth, matched by seq.

    `truth`, `sandbox`, `pred`: that rank's events as columns ``seq, iteration, start_ns, end_ns`` (ns, any
    clock per table; only durations are compared); `compute`: the seqs of its compute events. Returns the
    median and p95 of |duration error| (ms) of the sandbox and of the prediction over the events all three
    hold in iterations >= 1, and the signed error of the total compute duration (%)."""
    t = _durations(truth["seq"], truth["iteration"], truth["start_ns"], truth["end_ns"])
    s = _durations(sandbox["seq"], sandbox["iteration"], sandbox["start_ns"], sandbox["end_ns"])
    p = _durations(pred["seq"], pred["iteration"], pred["start_ns"], pred["end_ns"])
    common = sorted(k for k in t if k in s and k in p and t[k][0] >= 1)
    sb = [abs(s[k][1] - t[k][1]) / 1e6 for k in common]
    pr = [abs(p[k][1] - t[k][1]) / 1e6 for k in common]
    comp = [k for k in common if k in compute]
    total = sum(t[k][1] for k in comp)

    def pct(d: dict) -> float:
        return 100.0 * (sum(d[k][1] for k in comp) - total) / total if total else float("nan")

    (s_med, s_p95), (p_med, p_p95) = _abs_stats(sb), _abs_stats(pr)
    return {"n_compared": len(common), "sandbox_dur_med_ms": s_med, "sandbox_dur_p95_ms": s_p95,
            "pred_dur_med_ms": p_med, "pred_dur_p95_ms": p_p95,
            "sandbox_compute_err_pct": pct(s), "pred_compute_err_pct": pct(p)}


# ----------------------------------------------------------------------------------------------- table

HEADER = ("| config | prism ms (final) | error % | in spread | first pass ms (untimed; with --passes 2) | error % "
          "| in spread | sandbox rank (of the sandbox) | truth rank ms | truth rank spread ms | sandbox ms | error % | predicted rank ms "
          "| error % | emulated job ms | error % | ev dur err ms sandbox med/p95 | ev dur err ms prism med/p95 "
          "| compute sum err % sandbox / prism |")
RULE = "|" + "---|" * 19


def truth_rank(result, rank: int) -> list[float]:
    """The rank's iteration time in every truth run that recorded it (``truth_rank_ms``)."""
    return [run[rank] for run in result.truth_rank_ms if rank < len(run) and run[rank] is not None]


def _err(value: float | None, truth: float) -> str:
    return "-" if value is None or not truth else f"{100.0 * (value - truth) / truth:+.1f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def row(r) -> str:
    """One config's row: final and first-pass prediction, and the first prism run's emulated sandbox."""
    if not r.ok:
        return f"| {r.cfg.name} | FAILED |"
    untimed = statistics.median(r.pred_untimed_ms) if r.pred_untimed_ms else None
    lo, hi = min(r.truth_ms), max(r.truth_ms)
    cells = [r.cfg.name, f"{r.pred:.2f}", f"{r.err(r.pred):+.1f}", "yes" if r.inside() else "no",
             _ms(untimed), _err(untimed, r.truth), "-" if untimed is None else ("yes" if lo <= untimed <= hi else "no")]
    em = r.emulated[0] if r.emulated else None
    if em is None or em.get("error"):
        cells += [f"not run{': ' + em['error'][:200].replace('|', '/') if em else ''}"] + ["-"] * 11
        return "| " + " | ".join(cells) + " |"
    rank = int(em["rank"])
    tr = truth_rank(r, rank)
    t_med = statistics.median(tr) if tr else 0.0
    ev = em.get("events") or {}
    of = em.get("sandbox_ranks") or [rank]
    cells += [str(rank) if of == [rank] else f"{rank} (of {','.join(map(str, of))})", _ms(t_med if tr else None), f"{min(tr):.2f}-{max(tr):.2f}" if tr else "-",
              _ms(em.get("sandbox_ms")), _err(em.get("sandbox_ms"), t_med),
              _ms(em.get("pred_rank_ms")), _err(em.get("pred_rank_ms"), t_med),
              _ms(em.get("job_ms")), _err(em.get("job_ms"), r.truth),
              f"{ev.get('sandbox_dur_med_ms', float('nan')):.3f}/{ev.get('sandbox_dur_p95_ms', float('nan')):.3f}",
              f"{ev.get('pred_dur_med_ms', float('nan')):.3f}/{ev.get('pred_dur_p95_ms', float('nan')):.3f}",
              f"{ev.get('sandbox_compute_err_pct', float('nan')):+.1f} / {ev.get('pred_compute_err_pct', float('nan')):+.1f}"]
    return "| " + " | ".join(cells) + " |"


def totals(results) -> list[str]:
    """Means over the configs that have a first pass / an emulated sandbox."""
    ok = [r for r in results if r.ok and r.pred_untimed_ms]
    lines = []
    if ok:
        errs = [abs(r.err(statistics.median(r.pred_untimed_ms))) for r in ok]
        inside = sum(min(r.truth_ms) <= statistics.median(r.pred_untimed_ms) <= max(r.truth_ms) for r in ok)
        final = [abs(r.err(r.pred)) for r in ok]
        lines += [f"first pass (untimed slices): mean |error| {statistics.mean(errs):.1f} %, inside the truth's "
                  f"spread {inside} of {len(ok)}; final (timed slices) on the same configs: mean |error| "
                  f"{statistics.mean(final):.1f} %, inside {sum(r.inside() for r in ok)} of {len(ok)}"]
    emu = [(r, r.emulated[0]) for r in results if r.ok and r.emulated and not r.emulated[0].get("error")
           and r.emulated[0].get("sandbox_ms") is not None and truth_rank(r, int(r.emulated[0]["rank"]))]
    if emu:
        def mean_abs(key: str) -> float:
            vals = [abs(100.0 * (em[key] - statistics.median(truth_rank(r, int(em["rank"]))))
                        / statistics.median(truth_rank(r, int(em["rank"])))) for r, em in emu if em.get(key) is not None]
            return statistics.mean(vals) if vals else float("nan")

        job = [abs(r.err(em["job_ms"])) for r, em in emu if em.get("job_ms") is not None]
        lines += [f"emulated sandbox ({len(emu)} configs): its rank's iteration time mean |error| "
                  f"{mean_abs('sandbox_ms'):.1f} % (the prediction for that rank: {mean_abs('pred_rank_ms'):.1f} %); "
                  f"emulated job mean |error| {statistics.mean(job) if job else float('nan'):.1f} %"]
    return lines


def table(results) -> list[str]:
    """The table of the configs that have a first pass or an emulation (none: no lines)."""
    shown = [r for r in results if r.pred_untimed_ms or r.emulated]
    if not shown:
        return []
    return [HEADER, RULE] + [row(r) for r in shown] + [""] + totals(shown)


def emulated_sandbox(job: Path, timeline: pa.Table, truth0: Path | None) -> dict:
    """The emulated sandbox of a prism run (`prism/bench/fidelity_sandbox.py`): its rank, its own and the
    emulated job's iteration times, the prediction for its rank, per-event errors against `truth0`."""
    failed = job / "emulate.failed"
    if failed.is_file():
        return {"error": failed.read_text()[:500]}
    em = pq.read_table(job_files.emulation(job, "iterations.parquet"))
    src = _strings(em.column("source"))
    rank = em.column("rank").to_numpy()
    sb = src == "sandbox"
    ranks = sorted(set(rank[sb].tolist()))
    if not ranks:
        return {"error": f"{job_files.emulation(job, 'iterations.parquet')}: no sandbox rows"}
    r = sandbox_ranks(job, whole_slice=False)[0]
    if r not in ranks:
        return {"error": f"{job_files.emulation(job)}: the default sandbox rank {r} is not among its sandbox "
                         f"ranks {ranks}"}
    # the figures the emulation's summary and the report show (prism/emulate/results.py)
    fig = emulation_results.figures(em, pq.read_table(job_files.calibrated(job, "iterations")))
    mine = next(x for x in fig.ranks if x.rank == r)
    out = {"rank": r, "sandbox_ranks": ranks, "sandbox_ms": mine.measured_ms, "job_ms": fig.under_sandbox_ms,
           "computed_rank_ms": mine.program_ms, "delay_ms": mine.delay_ms, "pred_rank_ms": mine.predicted_ms,
           "iterations": fig.iterations}
    if truth0 is not None:
        cols = ["rank", "seq", "kind", "iteration", "t_start_ns", "t_end_ns"]
        real = pq.read_table(job_files.graph_file(truth0), columns=cols)
        real = real.filter(pa.compute.equal(real.column("rank"), r))
        ev = pq.read_table(job_files.emulation(job, "events.parquet"), columns=["rank", "seq", "iteration",
                                                                                 "start_ns", "end_ns", "source"])
        ev = ev.filter(pa.compute.equal(ev.column("rank"), r))
        ev = ev.filter(pa.array(_strings(ev.column("source")) == "sandbox"))
        graph = pq.read_table(job_files.graph_file(job), columns=["rank", "seq", "event_id", "iteration"])
        graph = graph.filter(pa.compute.equal(graph.column("rank"), r))
        tl = timeline.filter(pa.compute.equal(timeline.column("rank"), r))
        it_of = dict(zip(graph.column("seq").to_pylist(), graph.column("iteration").to_pylist()))
        tl_seq = tl.column("seq").to_pylist()
        compute = {int(s) for s, k in zip(real.column("seq").to_pylist(), _strings(real.column("kind")))
                   if k == "compute"}
        out["events"] = sandbox_event_errors(
            {"seq": real.column("seq").to_pylist(), "iteration": real.column("iteration").to_pylist(),
             "start_ns": real.column("t_start_ns").to_pylist(), "end_ns": real.column("t_end_ns").to_pylist()},
            {"seq": ev.column("seq").to_pylist(), "iteration": ev.column("iteration").to_pylist(),
             "start_ns": ev.column("start_ns").to_pylist(), "end_ns": ev.column("end_ns").to_pylist()},
            {"seq": tl_seq, "iteration": [it_of.get(s, -1) for s in tl_seq],
             "start_ns": tl.column("start_ns").to_pylist(), "end_ns": tl.column("end_ns").to_pylist()},
            compute)
    return out
