"""Which measurement carries a prediction's error: another run's measurements swapped into a real run's own inputs,
one class of events at a time.

    python -m prism.bench.fidelity_terms CONFIG_DIR [CONFIG_DIR ...] [--pass slices|slices_timed] [--rule R]
    python -m prism.bench.fidelity_terms --against OTHER_JOB JOB

The calibration sweep is exact on a real run's own measurements (`prism.bench.fidelity_model`: within 0.2 % on the
committed truths). So the sweep on truth0's graph with its own inputs, but one class of them taken from the slice runs
(a CONFIG_DIR of `prism bench fidelity --work DIR`, or a device run's tables unpacked: `truth0/graph/`,
`prism0/graph/`, `prism0/slices/plan.parquet`, `prism0/<pass>/{durations,transfers}.parquet`), says how much of the
prediction's error that class carries. Events are matched by (rank, seq): the capture and the real graph align.
Classes: **compute**; **ops+markers** (an op's issue span, markers); the **comm delays** (each blocking wait's own
time and the comm's transfer: `durations.measured_run`'s terms of the clock rule) of **p2p** comms, of
**collectives in one slice** (every member ran for real in the same slice run) and of **collectives across slices**
(members in different slice runs: each slice measured its own members against its replayed peers); **all** (every
input from the slices: the prediction itself, on truth0's graph). Each is the error % of the iteration time against
the sweep on truth0's own inputs. Per CONFIG_DIR also: each slice run's compute speed (its compute events' CPU time
over truth0's on the same events), and the drain of the largest burst of async collectives (ms between completions,
after the first third of the burst) of the slice run's first rank, in the slice run and in truth0; the compute spans'
excess over the CPU time at truth0's wall/CPU; the bytes of reductions in groups of more than two members.

``--against OTHER_JOB JOB``: the same classes (compute, ops+markers, comm delays, all) taken from another *real* run of
the same program (a job folder with ``graph/``). This is the floor of a swap: the delays of one run fit its own
compute (a rank's stall lands where that run had slack), so moving one class between two real runs of one config
already moves the iteration time by several % (docs/fidelity.md, session 10), while 'all' gives the other run's own
time. A class's term is attribution, not error, unless it exceeds that floor.

Analysis only: nothing here feeds a prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from prism import artifacts
from prism import job as job_files
from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_MARKER, K_RECV, K_SEND, K_WAIT

NO_SLICE = -1


def measured(job) -> tuple[np.ndarray, np.ndarray]:
    """A real run's own inputs of the sweep (`durations.measured_run`): durations per event, transfer per comm."""
    g, c = job.graph, job.columns
    return rules.measured_run(g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"], c["t_end_ns"],
                              c["t_complete_ns"], g.n_comms)


def iteration_ms(job, durations: np.ndarray, transfer: np.ndarray) -> float:
    """The sweep's iteration time (`prism.iterations`: median over k >= 1) on `job`'s graph with these inputs."""
    from prism.calibrate.stage import iterations_table
    from prism.calibrate.sweep import discover
    from prism.iterations import iteration_times

    _, timeline = discover(job.graph, durations.astype(np.int64), transfer.astype(np.int64))
    it = iterations_table(job, timeline)
    return iteration_times(it["iteration"].to_numpy(), it["end_ns"].to_numpy()).median_ms


def _aligned(a, b, what: str) -> np.ndarray:
    """The comm map a -> b of two graphs of one program (same ranks, seqs and kinds), by their member events."""
    if not (np.array_equal(a.rank, b.rank) and np.array_equal(a.seq, b.seq)
            and np.array_equal(a.graph.kind, b.graph.kind)):
        raise ValueError(f"{what}: the two graphs do not align event by event (rank, seq, kind): not one program")
    cmap = np.full(a.graph.n_comms, -1, dtype=np.int64)
    ops = np.flatnonzero(a.graph.comm >= 0)
    cmap[a.graph.comm[ops]] = b.graph.comm[ops]
    return cmap


def _by_id(path: Path, key: str, value: str, ids: np.ndarray) -> np.ndarray:
    table = artifacts.read_parquet(path, columns=[key, value], versioned=False)
    pos = {int(x): i for i, x in enumerate(table[key].to_numpy())}
    col = table[value].to_numpy()
    return np.array([col[pos[int(x)]] for x in ids], dtype=np.int64)


def _wait_comm(g) -> np.ndarray:
    """Per event: the comm a blocking wait (on a collective or a recv) waits for, else -1."""
    out = np.full(len(g.kind), -1, dtype=np.int64)
    w = np.flatnonzero((g.kind == K_WAIT) & (g.wait_op >= 0))
    w = w[g.kind[g.wait_op[w]] != K_SEND]
    out[w] = g.comm[g.wait_op[w]]
    return out


def swap_terms(job, own: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray],
               comm_classes: dict[str, np.ndarray]) -> dict[str, float]:
    """Error % of the sweep's iteration time when one class of `other`'s inputs replaces `own`'s (both in `job`'s
    event and comm order): 'compute', 'ops+markers', 'comm delays: <class>' for each comm class (a bool per
    comm), 'all'. The base is the sweep on `own` ('own ms')."""
    dur, x = own
    o_dur, o_x = other
    k = job.graph.kind
    base = iteration_ms(job, dur, x)

    def pct(ms: float) -> float:
        return 100 * (ms - base) / base

    out = {"own ms": base}
    for name, sel in (("compute", k == K_COMPUTE),
                      ("ops+markers", np.isin(k, (K_COLLECTIVE, K_SEND, K_RECV, K_MARKER)))):
        out[name] = pct(iteration_ms(job, np.where(sel, o_dur, dur), x))
    waits = _wait_comm(job.graph)
    for name, cls in comm_classes.items():
        if cls.any():
            sel = (waits >= 0) & cls[np.maximum(waits, 0)]
            out[f"comm delays: {name}"] = pct(iteration_ms(job, np.where(sel, o_dur, dur), np.where(cls, o_x, x)))
    out["all"] = pct(iteration_ms(job, o_dur, o_x))
    return out


def slice_of_events(config_dir: Path, job) -> np.ndarray:
    """Per event of the (aligned) graph: the slice whose run measured its rank (the plan), -1 if none."""
    plan = artifacts.read_parquet(job_files.slice_plan(config_dir / "prism0")).to_pylist()
    by_rank = {r["rank"]: r["slice"] for r in plan if r["measured"]}
    return np.array([by_rank.get(int(r), NO_SLICE) for r in job.rank], dtype=np.int64)


def comm_classes(job, slice_of: np.ndarray) -> dict[str, np.ndarray]:
    """p2p comms; collectives whose members all ran in one slice run; collectives across slice runs."""
    g = job.graph
    ops = np.flatnonzero(g.comm >= 0)
    p2p = np.zeros(g.n_comms, dtype=bool)
    p2p[g.comm[ops[g.kind[ops] == K_RECV]]] = True
    lo = np.full(g.n_comms, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(g.n_comms, -1, dtype=np.int64)
    np.minimum.at(lo, g.comm[ops], slice_of[ops])
    np.maximum.at(hi, g.comm[ops], slice_of[ops])
    return {"p2p": p2p, "collectives in one slice": ~p2p & (lo == hi), "collectives across slices": ~p2p & (lo != hi)}


def slice_inputs(config_dir: Path, truth, pass_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """What calibration took from a slice pass (its durations and transfers tables), in truth0's order."""
    from prism.calibrate.stage import load_graph

    cap = load_graph(config_dir / "prism0")
    cmap = _aligned(truth, cap, str(config_dir))
    job = config_dir / "prism0"
    dur = _by_id(job_files.own_durations(job, pass_dir), "event_id", "duration_ns", cap.event_ids)
    x = _by_id(job_files.slice_transfers(job, pass_dir), "comm_id", "transfer_ns", cap.comm_ids)
    return dur, x[cmap]


RULES = ("saved", "min", "mean", "max")


def slice_inputs_by_rule(config_dir: Path, truth, pass_dir: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """A pass's inputs recomputed from its slice events with another rule for a comm measured by several
    slice runs: its transfer the smallest ('min': `from_slices`' rule of sessions 10-16, and each member keeps its
    own delay as its wait's own time), or the mean ('mean': `from_slices`' rule since session 17) / the largest of
    the slices' first-member delays, each member's own time its lag behind its *own* slice's first member.
    Analysis of the rule only (docs/fidelity.md, sessions 10 and 17)."""
    from prism.calibrate.from_slices import _replayed, member_delays
    from prism.calibrate.stage import load_graph

    cap = load_graph(config_dir / "prism0")
    cmap = _aligned(truth, cap, str(config_dir))
    g = cap.graph
    none = np.iinfo(np.int64).max
    cpos = {int(c): i for i, c in enumerate(cap.comm_ids)}
    runs = _slice_runs(config_dir, pass_dir, cap, extra=("cpu_ns",))
    own = np.full(len(cap.event_ids), -1, dtype=np.int64)
    issues, firsts = [], []
    for name, t in runs:
        rows = np.flatnonzero(t["t_end_ns"] >= 0)
        own[rows] = rules.own_ns(g.kind, t["device_ns"], t["cpu_ns"])[rows]
        issues.append(_replayed(job_files.table_file(job_files.slices_dir(config_dir / "prism0", pass_dir) / name,
                                                      "replay"), cpos))
        firsts.append(member_delays(g.kind, g.comm, g.wait_op, t["t_start_ns"], t["t_end_ns"], t["t_complete_ns"],
                                    rows, g.n_comms, issues[-1]))
    f = np.stack(firsts)
    seen = f != none
    got = seen.any(axis=0)
    x = np.zeros(g.n_comms, dtype=np.int64)
    if rule == "min":
        x[got] = f.min(axis=0)[got]
    elif rule == "mean":
        x[got] = np.where(seen, f, 0).sum(axis=0)[got] // seen.sum(axis=0)[got]
    else:
        x[got] = np.where(seen, f, -1).max(axis=0)[got]
    dur = np.zeros(len(cap.event_ids), dtype=np.int64)
    for (name, t), rep, fk in zip(runs, issues, firsts):
        rows = np.flatnonzero(t["t_end_ns"] >= 0)
        lag_base = x if rule == "min" else np.where(fk != none, fk, x)
        part, _ = rules.measured_run(g.kind, g.comm, g.wait_op, own, t["t_start_ns"], t["t_end_ns"],
                                     t["t_complete_ns"], g.n_comms, transfer=lag_base, issues=rep)
        dur[rows] = part[rows]
    return dur, x[cmap]


def _slice_runs(config_dir: Path, pass_dir: str, cap, extra: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """Each slice run of a pass: (its folder name, its events' times in the capture graph's order, -1 elsewhere)."""
    pos = {int(e): i for i, e in enumerate(cap.event_ids)}
    names = ("t_start_ns", "t_end_ns", "t_complete_ns", "device_ns", *extra)
    runs = []
    for path in job_files.slice_files(config_dir / "prism0", folder=pass_dir):
        ev = artifacts.read_parquet(path, columns=["event_id", *names])
        rows = np.array([pos[int(e)] for e in ev["event_id"].to_numpy()], dtype=np.int64)
        cols = {name: np.full(len(cap.event_ids), -1, dtype=np.int64) for name in names}
        for name, arr in cols.items():
            arr[rows] = ev[name].to_numpy()
        runs.append((path.parent.name, cols))
    return runs


def compute_speed(truth, run: dict[str, np.ndarray]) -> float:
    """A slice run's compute CPU time over truth0's, on the compute events of iterations >= 1 it measured."""
    sel = (truth.graph.kind == K_COMPUTE) & (truth.iteration >= 1) & (run["device_ns"] >= 0)
    return float(run["device_ns"][sel].sum() / max(truth.columns["device_ns"][sel].sum(), 1))


def compute_wall_excess_ms(truth, run: dict[str, np.ndarray]) -> float:
    """How much longer a slice run's compute spans are than its CPU time at truth0's wall/CPU ratio would make
    them: ms per rank-iteration (iterations >= 1); what shares a slice rank's core shows here."""
    c = truth.columns
    sel = (truth.graph.kind == K_COMPUTE) & (truth.iteration >= 1)
    ratio = (c["t_end_ns"] - c["t_start_ns"])[sel].sum() / max(c["device_ns"][sel].sum(), 1)
    sel &= run["device_ns"] >= 0
    n = len(np.unique(truth.rank[sel])) * len(np.unique(truth.iteration[sel]))
    wall = (run["t_end_ns"] - run["t_start_ns"])[sel].sum()
    return float((wall - ratio * run["device_ns"][sel].sum()) / 1e6 / max(n, 1))


def loaded_result_mb(config_dir: Path) -> float:
    """MB per rank-iteration (iterations >= 1) of the reductions in groups of more than two members: the
    captured results a slice rank loads (`runtime/slice/transport.py`, CapturedResults)."""
    ev = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0"),
                                columns=["rank", "kind", "op", "group_name", "bytes", "iteration"]).to_pylist()
    groups = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0", "groups"),
                                    columns=["group_name", "ring"])
    size = {str(g): len(r) for g, r in zip(groups["group_name"].to_pylist(), groups["ring"].to_pylist())}
    later = [e for e in ev if e["iteration"] >= 1]
    n = len({e["rank"] for e in later}) * len({e["iteration"] for e in later})
    total = sum(e["bytes"] for e in later if e["kind"] == "collective" and size.get(str(e["group_name"]), 0) > 2
                and e["op"] in ("all_reduce", "allreduce_coalesced", "reduce_scatter", "reduce"))
    return total / 1e6 / max(n, 1)


def burst_drain_ms(job, is_async: np.ndarray, times: dict[str, np.ndarray], rank: int = 0) -> float:
    """Median over iterations >= 1 of how far apart `rank`'s async collectives of the iteration's largest group
    burst complete (as the rank saw them: its wait's end), after the first third of the burst: ms per op. A
    backlog (ops issued faster than they complete) drains at the comm's own pace. NaN without a burst."""
    g = job.graph
    seen = np.full(len(g.kind), -1, dtype=np.int64)
    w = np.flatnonzero((g.kind == K_WAIT) & (g.wait_op >= 0))
    seen[g.wait_op[w]] = times["t_end_ns"][w]
    rates = []
    for it in np.unique(job.iteration[job.iteration >= 1]):
        ops = np.flatnonzero((job.rank == rank) & (job.iteration == it) & (g.kind == K_COLLECTIVE) & (seen >= 0)
                             & is_async)
        if len(ops) < 6:
            continue
        s = np.sort(seen[ops])
        third = len(s) // 3
        rates.append((s[-1] - s[third]) / 1e6 / (len(s) - 1 - third))
    return float(np.median(rates)) if rates else float("nan")


def report(config_dir: Path, pass_dir: str, rule: str = "saved") -> list[str]:
    from prism.calibrate.stage import load_graph

    truth = load_graph(config_dir / "truth0")
    cap = load_graph(config_dir / "prism0")
    classes = comm_classes(truth, slice_of_events(config_dir, truth))
    inputs = slice_inputs(config_dir, truth, pass_dir) if rule == "saved" else \
        slice_inputs_by_rule(config_dir, truth, pass_dir, rule)
    terms = swap_terms(truth, measured(truth), inputs, classes)
    what = pass_dir if rule == "saved" else f"{pass_dir} with the {rule!r} rule across slices"
    lines = [f"{config_dir}  ({what} into truth0's own inputs; sweep on them {terms.pop('own ms'):.2f} ms)",
             "  " + " | ".join(f"{k} {v:+.1f} %" for k, v in terms.items())]
    ev = artifacts.read_parquet(job_files.graph_file(config_dir / "truth0"), columns=["rank", "seq", "is_async"])
    order = np.lexsort((ev["seq"].to_numpy(), ev["rank"].to_numpy()))  # load_graph's order
    is_async = ev["is_async"].to_numpy(zero_copy_only=False)[order]
    speed, drain = [], []
    for name, run in _slice_runs(config_dir, pass_dir, cap):
        speed.append(f"{name} {compute_speed(truth, run):.2f} (wall beyond truth0's wall/CPU "
                     f"{compute_wall_excess_ms(truth, run):+.1f} ms per rank-iteration)")
        rank = int(truth.rank[np.flatnonzero(run["t_end_ns"] >= 0)[0]])
        drain.append(f"{name} (rank {rank}) {burst_drain_ms(truth, is_async, run, rank):.2f} "
                     f"truth0 {burst_drain_ms(truth, is_async, truth.columns, rank):.2f}")
    lines.append("  compute CPU vs truth0: " + " ".join(speed))
    lines.append("  async burst drain, ms per op: " + " ".join(drain))
    lines.append(f"  reductions in groups of > 2 members (captured results a slice rank loads): "
                 f"{loaded_result_mb(config_dir):.2f} MB per rank-iteration")
    return lines


def against(job_dir: Path, other_dir: Path) -> list[str]:
    from prism.calibrate.stage import load_graph

    job, other = load_graph(job_dir), load_graph(other_dir)
    cmap = _aligned(job, other, f"{job_dir} vs {other_dir}")
    o_dur, o_x = measured(other)
    every = np.ones(job.graph.n_comms, dtype=bool)
    terms = swap_terms(job, measured(job), (o_dur, o_x[cmap]), {"all comms": every})
    return [f"{job_dir} <- {other_dir}  (sweep on its own inputs {terms.pop('own ms'):.2f} ms)",
            "  " + " | ".join(f"{k} {v:+.1f} %" for k, v in terms.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prism.bench.fidelity_terms", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", type=Path, nargs="+", metavar="DIR")
    parser.add_argument("--pass", dest="pass_dir", default=job_files.TIMED_SLICES,
                        choices=(job_files.SLICES, job_files.TIMED_SLICES))
    parser.add_argument("--rule", choices=RULES, default="saved",
                        help="the pass's inputs as calibration saved them, or recomputed from a timed pass's slice "
                             "events with another rule for comms measured by several slices (slice_inputs_by_rule)")
    parser.add_argument("--against", type=Path, metavar="OTHER_JOB",
                        help="another real run's job folder: swap its measurements into each DIR (a job folder)")
    args = parser.parse_args(argv)
    status = 0
    for d in args.dirs:
        need = ([job_files.graph_dir(d)] if args.against
                else [job_files.graph_dir(d / "truth0"), job_files.slices_dir(d / "prism0", args.pass_dir)])
        missing = [p for p in need + ([job_files.graph_dir(args.against)] if args.against else []) if not p.is_dir()]
        if missing:
            print(f"prism fidelity_terms: error: {missing[0]} is missing (a config folder of `prism bench fidelity "
                  "--work DIR`, or with --against two job folders holding graph/)", file=sys.stderr)
            status = 2
            continue
        try:
            lines = against(d, args.against) if args.against else report(d, args.pass_dir, args.rule)
        except (ValueError, KeyError, artifacts.ArtifactError) as exc:
            print(f"prism fidelity_terms: error: {d}: {exc}", file=sys.stderr)
            status = 2
            continue
        print("\n".join(lines), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
